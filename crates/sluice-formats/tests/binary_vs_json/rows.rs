//! Rows of a family: one field in focus, the others in scope or absent,
//! in the table's order or shuffled, metadata last.

use crate::values::{Col, Frag};
use proptest::prelude::*;
use std::rc::Rc;

// ---- rows and batches --------------------------------------------------

/// A row: its fields (key text, value) in the order written, and which
/// column is in focus.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) focus: usize,
    pub(crate) fields: Vec<(String, Frag)>,
}

impl Row {
    pub(crate) fn good(&self) -> bool {
        self.fields.iter().all(|(_, f)| f.good)
    }

    pub(crate) fn json(&self, offset: usize) -> Vec<u8> {
        let mut out = b"{".to_vec();
        for (k, f) in &self.fields {
            out.extend_from_slice(k.as_bytes());
            out.push(b':');
            out.extend_from_slice(&f.text);
            out.push(b',');
        }
        out.extend_from_slice(
            format!("\"_topic\":\"t\",\"_partition\":0,\"_offset\":{offset}}}\n").as_bytes(),
        );
        out
    }
}

pub(crate) fn rows(cols: &Rc<Vec<Col>>) -> BoxedStrategy<Vec<Row>> {
    let n = cols.len();
    let cols = Rc::clone(cols);
    let row = (0..n)
        .prop_flat_map(move |focus| {
            let parts: Vec<BoxedStrategy<Option<(String, Frag)>>> = cols
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let key = c.key.clone();
                    let g = match &c.good {
                        _ if i == focus => c.gen.clone().prop_map(Some).boxed(),
                        Some(good) => {
                            prop_oneof![2 => Just(None), 1 => good.clone().prop_map(Some)].boxed()
                        }
                        None => Just(None).boxed(),
                    };
                    g.prop_map(move |f| f.map(|f| (key.clone(), f))).boxed()
                })
                .collect();
            (Just(focus), parts)
        })
        .prop_flat_map(|(focus, parts)| {
            // In the table's order (the encoder's one pass) or shuffled
            // (its general path).
            let fields: Vec<(String, Frag)> = parts.into_iter().flatten().collect();
            let order = prop_oneof![Just(fields.clone()), Just(fields).prop_shuffle()];
            (Just(focus), order)
        })
        .prop_map(|(focus, fields)| Row { focus, fields });
    proptest::collection::vec(row, 60..140).boxed()
}
