//! The direct transcoder: a Protobuf message's wire bytes → its JSON row,
//! without building a `DynamicMessage` on the way.
//!
//! In: [`Plans`], compiled once per schema (each message's fields by
//! number, their kinds, the key text and the text written for an unset
//! field), and the message bytes. The message is scanned once into a list
//! of where each known field occurs; the fields are then written in the
//! schema's order from that list.
//!
//! Out: the bytes [`super::Json`] writes for the message `DynamicMessage`
//! decodes, or `None` when the bytes hold anything this path leaves to
//! that slower one, which then decides: a group, an extension, a message
//! field that occurs twice (it merges), two members of one oneof, a map
//! entry without its key or value, a wire type that does not fit its field,
//! bytes that do not parse, text that is not UTF-8, nesting past
//! [`MAX_DEPTH`], a row past its limit. Tests compare both paths on random
//! messages and random bytes, and bound its cost by the steps and
//! comparisons it tallies ([`crate::work`]: bytes scanned, messages
//! entered, fields looked at, sort comparisons), not by timing it.

use super::{nanos_fit, well_known, wrapped, Json, WellKnown};
use crate::work;
use prost_reflect::{FieldDescriptor, FileDescriptor, Kind, MessageDescriptor};
use std::cell::RefCell;
use std::collections::HashMap;

/// Every message type a schema's file defines or reaches, compiled.
#[derive(Debug, Clone, Default)]
pub(super) struct Plans {
    plans: Vec<Plan>,
    /// Each enum's values: (number, the name as a JSON string), by number.
    enums: Vec<Vec<(i32, Box<[u8]>)>>,
    /// The plan of each message the file defines, by its message indexes
    /// (sorted).
    roots: Vec<(Vec<i32>, u32)>,
}

#[derive(Debug, Clone)]
struct Plan {
    form: Form,
    fields: Vec<Field>,
    /// Field index by field number, for numbers below [`DENSE`]
    /// (`u32::MAX`: none); `sparse` holds the rest.
    dense: Vec<u32>,
    sparse: HashMap<u32, u32>,
    /// False: this path never takes the message (extensions, groups or more
    /// oneofs than a mask holds).
    direct: bool,
}

/// How a message is written.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Form {
    Object,
    /// A Timestamp or a Duration: one text.
    Time(WellKnown),
    /// A wrapper type: its one field's value.
    Wrapper,
}

#[derive(Debug, Clone)]
struct Field {
    /// `"name":`
    key: Box<[u8]>,
    kind: Scalar,
    shape: Shape,
    presence: bool,
    oneof: Option<u8>,
    /// What is written for the field when it is unset and has no presence.
    unset: Box<[u8]>,
}

#[derive(Debug, Clone, Copy)]
enum Shape {
    One,
    List,
    Map { key: Scalar, value: Scalar },
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scalar {
    Double,
    Float,
    Int32,
    Int64,
    Uint32,
    Uint64,
    Sint32,
    Sint64,
    Fixed32,
    Fixed64,
    Sfixed32,
    Sfixed64,
    Bool,
    String,
    Bytes,
    Enum(u32),
    Message(u32),
}

impl Scalar {
    /// Whether a repeated field of it may be packed into one length-delimited run.
    fn packable(self) -> bool {
        !matches!(self, Scalar::String | Scalar::Bytes | Scalar::Message(_))
    }

    /// The wire type one value of it is written with.
    fn wire_type(self) -> u8 {
        match self {
            Scalar::Double | Scalar::Fixed64 | Scalar::Sfixed64 => I64,
            Scalar::Float | Scalar::Fixed32 | Scalar::Sfixed32 => I32,
            Scalar::String | Scalar::Bytes | Scalar::Message(_) => LEN,
            _ => VARINT,
        }
    }
}

const VARINT: u8 = 0;
const I64: u8 = 1;
const LEN: u8 = 2;
const I32: u8 = 5;

/// Field numbers below this are looked up in a table, the rest in a map.
const DENSE: u32 = 1024;

/// How deep messages may nest on this path (the slow one allows 100).
const MAX_DEPTH: usize = 64;

impl Plans {
    /// Compiles every message `file` defines and every one they reach.
    pub(super) fn compile(file: &FileDescriptor) -> Plans {
        let mut b = Builder::default();
        let mut roots = Vec::new();
        let mut stack: Vec<(Vec<i32>, MessageDescriptor)> = file
            .messages()
            .enumerate()
            .map(|(i, m)| (vec![i as i32], m))
            .collect();
        while let Some((path, m)) = stack.pop() {
            for (i, child) in m.child_messages().enumerate() {
                let mut p = path.clone();
                p.push(i as i32);
                stack.push((p, child));
            }
            let plan = b.plan(&m);
            roots.push((path, plan));
        }
        while let Some((at, m)) = b.todo.pop() {
            b.plans[at as usize] = b.compile(&m);
        }
        roots.sort();
        Plans {
            plans: b.plans,
            enums: b.enums,
            roots,
        }
    }

    /// Appends the message at message indexes `path` (`bytes`: its wire
    /// form) to `out` as [`super::Json`] would, or returns `None` (with
    /// `out` as it was) to leave it to the slow path.
    pub(super) fn write(
        &self,
        path: &[i32],
        bytes: &[u8],
        out: &mut Vec<u8>,
        limit: usize,
    ) -> Option<()> {
        let at = self
            .roots
            .binary_search_by(|(p, _)| p.as_slice().cmp(path))
            .ok()?;
        let plan = self.roots[at].1;
        let start = out.len();
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let (seen, entries) = &mut *scratch;
            seen.clear();
            entries.clear();
            let mut w = Writer {
                plans: self,
                out,
                end: start.saturating_add(limit),
                seen,
                entries,
            };
            // Past the limit is the slow path's to refuse (it stops sooner).
            let written = w.message(plan, bytes, 0).filter(|_| w.out.len() <= w.end);
            if written.is_none() {
                w.out.truncate(start);
            }
            // A huge message does not keep its lists' room on the thread.
            if seen.capacity() > 1 << 12 || entries.capacity() > 1 << 12 {
                *scratch = Default::default();
            }
            written
        })
    }
}

/// Drops this thread's lists, so that a test measures a run from the start.
#[cfg(test)]
pub(super) fn drop_scratch() {
    SCRATCH.with(|s| *s.borrow_mut() = Default::default());
}

#[derive(Default)]
struct Builder {
    plans: Vec<Plan>,
    enums: Vec<Vec<(i32, Box<[u8]>)>>,
    index: HashMap<String, u32>,
    enum_index: HashMap<String, u32>,
    todo: Vec<(u32, MessageDescriptor)>,
}

impl Builder {
    /// The plan index of `m`, queued for compiling when new.
    fn plan(&mut self, m: &MessageDescriptor) -> u32 {
        if let Some(&at) = self.index.get(m.full_name()) {
            return at;
        }
        let at = self.plans.len() as u32;
        self.plans.push(Plan {
            form: Form::Object,
            fields: Vec::new(),
            dense: Vec::new(),
            sparse: HashMap::new(),
            direct: false,
        });
        self.index.insert(m.full_name().to_string(), at);
        self.todo.push((at, m.clone()));
        at
    }

    fn compile(&mut self, m: &MessageDescriptor) -> Plan {
        let form = match (well_known(m), wrapped(m)) {
            (Some(which), _) => Form::Time(which),
            (_, Some(_)) => Form::Wrapper,
            _ => Form::Object,
        };
        // A oneof's index by name; more than a mask holds leaves the
        // message to the slow path.
        let oneofs: HashMap<String, u8> = match m.oneofs().len() {
            0..=64 => m
                .oneofs()
                .zip(0..)
                .map(|(o, i)| (o.full_name().to_string(), i))
                .collect(),
            _ => HashMap::new(),
        };
        let mut direct = m.extensions().len() == 0 && m.oneofs().len() <= 64;
        // Field numbers in a table when it is not mostly holes.
        let dense_up_to = DENSE.min(4 * m.fields().len() as u32 + 16);
        let mut fields = Vec::new();
        let (mut dense, mut sparse) = (Vec::new(), HashMap::new());
        let descriptors: Vec<FieldDescriptor> = match form {
            Form::Wrapper => wrapped(m).into_iter().collect(),
            _ => m.fields().collect(),
        };
        for f in &descriptors {
            work::step(1);
            direct &= !f.is_group();
            let shape = if f.is_map() {
                let Kind::Message(entry) = f.kind() else {
                    unreachable!("a map field's kind is its entry message")
                };
                Shape::Map {
                    key: self.scalar(&entry.map_entry_key_field().kind()),
                    value: self.scalar(&entry.map_entry_value_field().kind()),
                }
            } else if f.is_list() {
                Shape::List
            } else {
                Shape::One
            };
            let oneof = f.containing_oneof().and_then(|o| {
                // One probe; a search of the names (a compile quadratic in
                // the oneofs) would tally each name it passes.
                work::step(1);
                oneofs.get(o.full_name()).copied()
            });
            let mut unset = Vec::new();
            if !f.supports_presence() {
                // The slow path's own text for the field's default (a
                // scalar's, or an empty list or map).
                let _ = Json {
                    out: &mut unset,
                    end: usize::MAX,
                }
                .value(&f.default_value(), &f.kind());
            }
            let at = fields.len() as u32;
            if f.number() < dense_up_to {
                let n = f.number() as usize;
                if dense.len() <= n {
                    dense.resize(n + 1, u32::MAX);
                }
                dense[n] = at;
            } else {
                sparse.insert(f.number(), at);
            }
            fields.push(Field {
                key: key(f.name()),
                kind: self.scalar(&f.kind()),
                shape,
                presence: f.supports_presence(),
                oneof,
                unset: unset.into(),
            });
        }
        Plan {
            form,
            fields,
            dense,
            sparse,
            direct,
        }
    }

    fn scalar(&mut self, kind: &Kind) -> Scalar {
        match kind {
            Kind::Double => Scalar::Double,
            Kind::Float => Scalar::Float,
            Kind::Int32 => Scalar::Int32,
            Kind::Int64 => Scalar::Int64,
            Kind::Uint32 => Scalar::Uint32,
            Kind::Uint64 => Scalar::Uint64,
            Kind::Sint32 => Scalar::Sint32,
            Kind::Sint64 => Scalar::Sint64,
            Kind::Fixed32 => Scalar::Fixed32,
            Kind::Fixed64 => Scalar::Fixed64,
            Kind::Sfixed32 => Scalar::Sfixed32,
            Kind::Sfixed64 => Scalar::Sfixed64,
            Kind::Bool => Scalar::Bool,
            Kind::String => Scalar::String,
            Kind::Bytes => Scalar::Bytes,
            Kind::Message(m) => Scalar::Message(self.plan(m)),
            Kind::Enum(e) => {
                if let Some(&at) = self.enum_index.get(e.full_name()) {
                    return Scalar::Enum(at);
                }
                let mut values: Vec<(i32, Box<[u8]>)> = Vec::new();
                for v in e.values() {
                    // The name the slow path writes for the number (the
                    // first of its aliases).
                    let Some(named) = e.get_value(v.number()) else {
                        continue;
                    };
                    let mut text = Vec::new();
                    crate::json_text::string(&mut text, named.name().as_bytes());
                    values.push((v.number(), text.into()));
                }
                values.sort_by_key(|(n, _)| *n);
                values.dedup_by_key(|(n, _)| *n);
                let at = self.enums.len() as u32;
                self.enums.push(values);
                self.enum_index.insert(e.full_name().to_string(), at);
                Scalar::Enum(at)
            }
        }
    }
}

/// `"name":`
fn key(name: &str) -> Box<[u8]> {
    let mut k = Vec::new();
    crate::json_text::string(&mut k, name.as_bytes());
    k.push(b':');
    k.into()
}

/// Where a known field occurs in a message: its index in the plan, its
/// wire type, and its value (a varint's value, or the span of its bytes).
#[derive(Debug, Clone, Copy)]
struct Seen {
    field: u32,
    wire: u8,
    value: u64,
    start: u32,
    end: u32,
}

/// A map key, ordered as the slow path orders them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum MapKey {
    Int(i64),
    Uint(u64),
    Bool(bool),
    /// A span of the entry's message.
    Str(u32, u32),
}

/// A map's entry while they are sorted: the key, where the entry's bytes
/// start and end, and its value.
type Entry = (MapKey, u32, u32, Seen);

thread_local! {
    /// The writers' lists, kept from one message to the next on a thread.
    static SCRATCH: RefCell<(Vec<Seen>, Vec<Entry>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

struct Writer<'a> {
    plans: &'a Plans,
    out: &'a mut Vec<u8>,
    end: usize,
    /// Occurrences of the messages being written, innermost last.
    seen: &'a mut Vec<Seen>,
    /// The entries of the maps being written, innermost last.
    entries: &'a mut Vec<Entry>,
}

/// Reads a varint as prost does: at most ten bytes, the tenth at most 1.
fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *bytes.get(*at)?;
        *at += 1;
        work::step(1);
        if i == 9 && b > 1 {
            return None;
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Some(v);
        }
    }
    None
}

/// Reads one field's key and value at `at`: (number, wire type, value,
/// start, end), where a varint's value is in `value` and any other value
/// is `bytes[start..end]`.
fn field(bytes: &[u8], at: &mut usize) -> Option<(u32, u8, u64, usize, usize)> {
    // prost refuses a key over u32::MAX.
    let key = u32::try_from(varint(bytes, at)?).ok()?;
    let (number, wire) = (key >> 3, (key & 7) as u8);
    if number == 0 {
        return None;
    }
    let start = *at;
    let value = match wire {
        VARINT => varint(bytes, at)?,
        I64 => {
            *at = at.checked_add(8)?;
            0
        }
        I32 => {
            *at = at.checked_add(4)?;
            0
        }
        LEN => {
            let len = usize::try_from(varint(bytes, at)?).ok()?;
            let start = *at;
            *at = at.checked_add(len)?;
            if *at > bytes.len() {
                return None;
            }
            return Some((number, wire, 0, start, *at));
        }
        _ => return None,
    };
    (*at <= bytes.len()).then_some((number, wire, value, start, *at))
}

impl Writer<'_> {
    fn message(&mut self, plan: u32, bytes: &[u8], depth: usize) -> Option<()> {
        let plans = self.plans;
        let p = &plans.plans[plan as usize];
        if !p.direct || depth > MAX_DEPTH || u32::try_from(bytes.len()).is_err() {
            return None;
        }
        work::step(1);
        let base = self.seen.len();
        let mut at = 0;
        while at < bytes.len() {
            let (number, wire, value, start, end) = field(bytes, &mut at)?;
            let known = match p.dense.get(number as usize) {
                Some(&f) => (f != u32::MAX).then_some(f),
                None => p.sparse.get(&number).copied(),
            };
            if let Some(field) = known {
                self.seen.push(Seen {
                    field,
                    wire,
                    value,
                    start: start as u32,
                    end: end as u32,
                });
            }
        }
        // Stable: a repeated field's values keep their order.
        let mine = &mut self.seen[base..];
        let by_field = |a: &Seen, b: &Seen| {
            work::compared(1);
            a.field.cmp(&b.field)
        };
        if !mine.is_sorted_by(|a, b| by_field(a, b).is_le()) {
            mine.sort_by(by_field);
        }
        let written = match p.form {
            Form::Object => self.object(p, bytes, base, depth),
            Form::Wrapper => match self.seen[base..] {
                [] => {
                    self.out.extend_from_slice(&p.fields[0].unset);
                    Some(())
                }
                [s] => self.one(p.fields[0].kind, s, bytes, depth),
                _ => None,
            },
            Form::Time(which) => self.time(which, base),
        };
        self.seen.truncate(base);
        written
    }

    fn object(&mut self, p: &Plan, bytes: &[u8], base: usize, depth: usize) -> Option<()> {
        let mut next = base;
        let mut oneofs = 0u64;
        self.out.push(b'{');
        let mut first = true;
        for (i, f) in p.fields.iter().enumerate() {
            let from = next;
            while next < self.seen.len() && self.seen[next].field == i as u32 {
                next += 1;
            }
            let count = next - from;
            work::step(1 + count);
            if count == 0 && f.presence {
                continue;
            }
            if let Some(o) = f.oneof.filter(|_| count > 0) {
                if oneofs & (1 << o) != 0 {
                    return None;
                }
                oneofs |= 1 << o;
            }
            if !std::mem::take(&mut first) {
                self.out.push(b',');
            }
            self.out.extend_from_slice(&f.key);
            if count == 0 {
                self.out.extend_from_slice(&f.unset);
                continue;
            }
            match f.shape {
                // Repeats merge or must all be valid: the slow path's.
                Shape::One if count > 1 => return None,
                Shape::One => self.one(f.kind, self.seen[from], bytes, depth)?,
                Shape::List => {
                    self.out.push(b'[');
                    let mut items = 0;
                    for k in from..next {
                        let s = self.seen[k];
                        if s.wire == LEN && f.kind.packable() {
                            let run = &bytes[s.start as usize..s.end as usize];
                            let mut at = 0;
                            while at < run.len() {
                                let item = packed(f.kind, run, &mut at)?;
                                if std::mem::replace(&mut items, 1) > 0 {
                                    self.out.push(b',');
                                }
                                self.one(f.kind, item, run, depth)?;
                            }
                        } else {
                            if std::mem::replace(&mut items, 1) > 0 {
                                self.out.push(b',');
                            }
                            self.one(f.kind, s, bytes, depth)?;
                        }
                    }
                    self.out.push(b']');
                }
                Shape::Map { key, value } => self.map(key, value, from, next, bytes, depth)?,
            }
        }
        self.out.push(b'}');
        Some(())
    }

    /// One value of `kind`, which occurs as `s` in `bytes`.
    fn one(&mut self, kind: Scalar, s: Seen, bytes: &[u8], depth: usize) -> Option<()> {
        if self.out.len() > self.end || s.wire != kind.wire_type() {
            return None;
        }
        let raw = &bytes[s.start as usize..s.end as usize];
        let v = s.value;
        work::step(1);
        use crate::json_text::int;
        match kind {
            Scalar::Int32 => int(self.out, v as i32),
            Scalar::Int64 => int(self.out, v as i64),
            Scalar::Uint32 => int(self.out, v as u32),
            Scalar::Uint64 => int(self.out, v),
            Scalar::Sint32 => int(self.out, zigzag(v as u32 as u64) as i32),
            Scalar::Sint64 => int(self.out, zigzag(v)),
            Scalar::Bool => self
                .out
                .extend_from_slice(if v != 0 { b"true" } else { b"false" }),
            Scalar::Enum(e) => {
                let n = v as i32;
                let values = &self.plans.enums[e as usize];
                match values.binary_search_by_key(&n, |(k, _)| *k) {
                    Ok(at) => self.out.extend_from_slice(&values[at].1),
                    Err(_) => int(self.out, n),
                }
            }
            Scalar::Fixed32 => int(self.out, u32::from_le_bytes(raw.try_into().ok()?)),
            Scalar::Sfixed32 => int(self.out, i32::from_le_bytes(raw.try_into().ok()?)),
            Scalar::Float => {
                crate::json_text::f32(self.out, f32::from_le_bytes(raw.try_into().ok()?))
            }
            Scalar::Fixed64 => int(self.out, u64::from_le_bytes(raw.try_into().ok()?)),
            Scalar::Sfixed64 => int(self.out, i64::from_le_bytes(raw.try_into().ok()?)),
            Scalar::Double => {
                crate::json_text::f64(self.out, f64::from_le_bytes(raw.try_into().ok()?))
            }
            Scalar::String => {
                work::step(raw.len());
                std::str::from_utf8(raw).ok()?;
                crate::json_text::string(self.out, raw);
            }
            Scalar::Bytes => {
                work::step(raw.len());
                crate::json_text::string(self.out, raw)
            }
            Scalar::Message(plan) => self.message(plan, raw, depth + 1)?,
        }
        Some(())
    }

    /// A map field's entries, which occur as `seen[from..to]`: sorted by key,
    /// the last of equal keys kept.
    fn map(
        &mut self,
        key: Scalar,
        value: Scalar,
        from: usize,
        to: usize,
        bytes: &[u8],
        depth: usize,
    ) -> Option<()> {
        let base = self.entries.len();
        for k in from..to {
            let s = self.seen[k];
            if s.wire != LEN {
                return None;
            }
            let entry = &bytes[s.start as usize..s.end as usize];
            let (mut k, mut v) = (None, None);
            let mut at = 0;
            while at < entry.len() {
                let (number, wire, val, start, end) = field(entry, &mut at)?;
                let part = Seen {
                    field: 0,
                    wire,
                    value: val,
                    start: start as u32,
                    end: end as u32,
                };
                // A repeated key or value is the slow path's.
                let slot = match number {
                    1 => &mut k,
                    2 => &mut v,
                    _ => continue,
                };
                if slot.replace(part).is_some() {
                    return None;
                }
            }
            let (k, v) = (k?, v?);
            if k.wire != key.wire_type() {
                return None;
            }
            let raw = &entry[k.start as usize..k.end as usize];
            let ordered = match key {
                Scalar::Int32 => MapKey::Int(i64::from(k.value as i32)),
                Scalar::Int64 => MapKey::Int(k.value as i64),
                Scalar::Sint32 => MapKey::Int(i64::from(zigzag(k.value as u32 as u64) as i32)),
                Scalar::Sint64 => MapKey::Int(zigzag(k.value)),
                Scalar::Uint32 => MapKey::Uint(u64::from(k.value as u32)),
                Scalar::Uint64 => MapKey::Uint(k.value),
                Scalar::Fixed32 => {
                    MapKey::Uint(u64::from(u32::from_le_bytes(raw.try_into().ok()?)))
                }
                Scalar::Fixed64 => MapKey::Uint(u64::from_le_bytes(raw.try_into().ok()?)),
                Scalar::Sfixed32 => {
                    MapKey::Int(i64::from(i32::from_le_bytes(raw.try_into().ok()?)))
                }
                Scalar::Sfixed64 => MapKey::Int(i64::from_le_bytes(raw.try_into().ok()?)),
                Scalar::Bool => MapKey::Bool(k.value != 0),
                Scalar::String => {
                    work::step(raw.len());
                    std::str::from_utf8(raw).ok()?;
                    MapKey::Str(s.start + k.start, s.start + k.end)
                }
                _ => return None,
            };
            self.entries.push((ordered, s.start, s.end, v));
        }
        // Every comparison of keys, the sort's and the duplicate check's,
        // goes through here and is tallied.
        let cmp = |a: &MapKey, b: &MapKey| {
            work::compared(1);
            match (a, b) {
                (MapKey::Str(a0, a1), MapKey::Str(b0, b1)) => {
                    bytes[*a0 as usize..*a1 as usize].cmp(&bytes[*b0 as usize..*b1 as usize])
                }
                _ => a.cmp(b),
            }
        };
        let mine = &mut self.entries[base..];
        mine.sort_by(|a, b| cmp(&a.0, &b.0));
        // A key given twice is the slow path's (every value must be valid).
        if mine.windows(2).any(|w| cmp(&w[0].0, &w[1].0).is_eq()) {
            self.entries.truncate(base);
            return None;
        }
        self.out.push(b'{');
        for i in base..self.entries.len() {
            let (k, start, end, v) = self.entries[i];
            if i > base {
                self.out.push(b',');
            }
            match k {
                MapKey::Str(a, b) => {
                    crate::json_text::string(self.out, &bytes[a as usize..b as usize])
                }
                MapKey::Int(n) => quoted(self.out, n),
                MapKey::Uint(n) => quoted(self.out, n),
                MapKey::Bool(b) => {
                    self.out
                        .extend_from_slice(if b { b"\"true\"" } else { b"\"false\"" })
                }
            }
            self.out.push(b':');
            let entry = &bytes[start as usize..end as usize];
            if self.one(value, v, entry, depth).is_none() {
                self.entries.truncate(base);
                return None;
            }
        }
        self.out.push(b'}');
        self.entries.truncate(base);
        Some(())
    }

    /// A Timestamp or a Duration from its occurrences `seen[base..]`
    /// (seconds: field 0, nanos: field 1), as the slow path writes them.
    fn time(&mut self, which: WellKnown, base: usize) -> Option<()> {
        let (mut secs, mut nanos) = (0i64, 0i32);
        for s in &self.seen[base..] {
            if s.wire != VARINT {
                return None;
            }
            match s.field {
                0 => secs = s.value as i64,
                _ => nanos = s.value as i32,
            }
        }
        if !nanos_fit(which, secs, nanos) {
            return None;
        }
        match which {
            WellKnown::Timestamp => {
                crate::json_text::datetime(self.out, secs, nanos as u64, 9, true).then_some(())
            }
            WellKnown::Duration => {
                super::duration_text(self.out, secs, nanos);
                Some(())
            }
        }
    }
}

/// One value of a packed run.
fn packed(kind: Scalar, run: &[u8], at: &mut usize) -> Option<Seen> {
    let start = *at;
    let value = match kind.wire_type() {
        VARINT => varint(run, at)?,
        I64 => {
            *at = at.checked_add(8).filter(|&e| e <= run.len())?;
            work::step(8);
            0
        }
        I32 => {
            *at = at.checked_add(4).filter(|&e| e <= run.len())?;
            work::step(4);
            0
        }
        _ => return None,
    };
    Some(Seen {
        field: 0,
        wire: kind.wire_type(),
        value,
        start: start as u32,
        end: *at as u32,
    })
}

fn zigzag(v: u64) -> i64 {
    ((v >> 1) as i64) ^ -((v & 1) as i64)
}

fn quoted(out: &mut Vec<u8>, n: impl itoa::Integer) {
    out.push(b'"');
    crate::json_text::int(out, n);
    out.push(b'"');
}
