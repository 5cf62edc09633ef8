//! The Confluent wire format of a record value written through a schema
//! registry.
//!
//! In: a Kafka record's value bytes. Out: the schema id and the payload
//! ([`frame`]) and, for Protobuf, the path of message indexes that names the
//! message type within the schema's file ([`message_indexes`]). The other
//! way, for producers: [`write_header`] and [`write_message_indexes`].
//!
//! Layout: a magic byte `0`, the schema id (4 bytes, big-endian), then the
//! payload. A Protobuf payload starts with the message indexes: a zigzag
//! varint count, then that many zigzag varint indexes (a single `0` byte
//! stands for `[0]`, the file's first message).

use std::borrow::Cow;
use thiserror::Error;

/// A record value that is not in the registry's wire format.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum FrameError {
    #[error("the value has {0} bytes; a registry-framed value has at least 5 (a magic byte 0 and a 4-byte schema id)")]
    Short(usize),
    #[error("the value starts with byte {0:#04x}, not the registry's magic byte 0x00")]
    Magic(u8),
    #[error("the Protobuf message indexes are cut short or malformed")]
    Indexes,
}

/// A registry-framed value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framed<'a> {
    pub schema_id: u32,
    pub payload: &'a [u8],
}

/// Splits `value` into its schema id and payload.
pub fn frame(value: &[u8]) -> Result<Framed<'_>, FrameError> {
    match value {
        [0, a, b, c, d, payload @ ..] => Ok(Framed {
            schema_id: u32::from_be_bytes([*a, *b, *c, *d]),
            payload,
        }),
        [magic, ..] if value.len() >= 5 => Err(FrameError::Magic(*magic)),
        _ => Err(FrameError::Short(value.len())),
    }
}

/// The most message indexes a value may carry: deeper nesting than this is
/// not a schema anyone writes, and a bound keeps a hostile count from
/// allocating.
const MAX_INDEXES: u64 = 64;

/// Reads the message indexes at the start of a Protobuf payload: the path
/// to the message type (`[0]`: the file's first message; `[1, 0]`: the
/// first message nested in the second). Returns it and the message bytes.
pub fn message_indexes(payload: &[u8]) -> Result<(Cow<'static, [i32]>, &[u8]), FrameError> {
    let (count, mut rest) = zigzag(payload)?;
    if count == 0 {
        return Ok((Cow::Borrowed(&[0]), rest));
    }
    if !(1..=MAX_INDEXES as i64).contains(&count) {
        return Err(FrameError::Indexes);
    }
    let mut path = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let (i, r) = zigzag(rest)?;
        path.push(i32::try_from(i).map_err(|_| FrameError::Indexes)?);
        rest = r;
    }
    Ok((Cow::Owned(path), rest))
}

/// Writes the header of a value written with schema `id`: the magic byte
/// and the id.
pub fn write_header(id: u32, out: &mut Vec<u8>) {
    out.push(0);
    out.extend_from_slice(&id.to_be_bytes());
}

/// Writes the message indexes of the message type at `path` (`[0]`, the
/// file's first message, as the single byte `0`, as the clients write it).
pub fn write_message_indexes(path: &[i32], out: &mut Vec<u8>) {
    if path == [0] {
        out.push(0);
        return;
    }
    write_zigzag(path.len() as i64, out);
    for &i in path {
        write_zigzag(i64::from(i), out);
    }
}

fn write_zigzag(v: i64, out: &mut Vec<u8>) {
    let mut n = ((v << 1) ^ (v >> 63)) as u64;
    loop {
        let b = (n & 0x7f) as u8;
        n >>= 7;
        if n == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// One zigzag-encoded varint (at most 10 bytes).
fn zigzag(bytes: &[u8]) -> Result<(i64, &[u8]), FrameError> {
    let mut n: u64 = 0;
    for (i, &b) in bytes.iter().enumerate().take(10) {
        n |= u64::from(b & 0x7f) << (7 * i);
        if b & 0x80 == 0 {
            let v = (n >> 1) as i64 ^ -((n & 1) as i64);
            return Ok((v, &bytes[i + 1..]));
        }
    }
    Err(FrameError::Indexes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn zz(v: i64) -> Vec<u8> {
        let mut out = Vec::new();
        write_zigzag(v, &mut out);
        out
    }

    #[test]
    fn a_framed_value_names_its_schema() {
        let v = [0, 0, 0, 1, 2, 0xaa, 0xbb];
        let f = frame(&v).unwrap();
        assert_eq!((f.schema_id, f.payload), (258, &[0xaa, 0xbb][..]));
        assert_eq!(frame(&[0, 0, 0, 0, 7]).unwrap().payload, &[] as &[u8]);
    }

    #[test]
    fn anything_else_is_named_for_what_is_wrong() {
        assert_eq!(frame(b"{\"a\":1}"), Err(FrameError::Magic(b'{')));
        assert_eq!(frame(&[0, 0, 1]), Err(FrameError::Short(3)));
        assert_eq!(frame(&[]), Err(FrameError::Short(0)));
        let e = FrameError::Magic(b'{').to_string();
        assert!(e.contains("0x7b"), "{e}");
    }

    #[test]
    fn message_indexes_follow_the_confluent_layout() {
        let (path, rest) = message_indexes(&[0, 8, 1]).unwrap();
        assert_eq!((&*path, rest), (&[0][..], &[8, 1][..]));
        let mut v = zz(2);
        v.extend(zz(1));
        v.extend(zz(0));
        v.push(9);
        let (path, rest) = message_indexes(&v).unwrap();
        assert_eq!((&*path, rest), (&[1, 0][..], &[9][..]));
        assert_eq!(message_indexes(&[]), Err(FrameError::Indexes));
        assert_eq!(
            message_indexes(&zz(3)),
            Err(FrameError::Indexes),
            "cut short"
        );
        assert_eq!(message_indexes(&zz(-1)), Err(FrameError::Indexes));
        assert_eq!(message_indexes(&zz(1 << 40)), Err(FrameError::Indexes));
        assert_eq!(message_indexes(&[0xff; 11]), Err(FrameError::Indexes));
    }

    proptest! {
        #[test]
        fn indexes_round_trip(path in prop::collection::vec(0i32..10_000, 1..8), tail in prop::collection::vec(any::<u8>(), 0..8)) {
            let mut v = zz(path.len() as i64);
            for &i in &path {
                v.extend(zz(i64::from(i)));
            }
            v.extend(&tail);
            let (got, rest) = message_indexes(&v).unwrap();
            prop_assert_eq!(&got, &path);
            prop_assert_eq!(rest, &tail[..]);
            // What producers write reads back the same.
            let mut w = Vec::new();
            write_header(7, &mut w);
            write_message_indexes(&path, &mut w);
            w.extend(&tail);
            let f = frame(&w).unwrap();
            prop_assert_eq!(f.schema_id, 7);
            let (got, rest) = message_indexes(f.payload).unwrap();
            prop_assert_eq!(got, path);
            prop_assert_eq!(rest, &tail[..]);
        }

        #[test]
        fn no_input_panics(v in prop::collection::vec(any::<u8>(), 0..32)) {
            let _ = frame(&v);
            let _ = message_indexes(&v);
        }
    }
}
