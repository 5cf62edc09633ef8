//! UUID and IPv4 text → their values, in the forms ClickHouse reads the
//! same way as here. (IPv6 text is read by the standard library's parser,
//! whose forms the differential test holds to ClickHouse's.)

/// 32 hex digits, with dashes after the 8th, 12th, 16th and 20th or none.
pub(crate) fn uuid(s: &[u8]) -> Option<[u8; 16]> {
    let hex: Vec<u8> = match s.len() {
        36 => {
            if [8, 13, 18, 23].iter().any(|&i| s[i] != b'-') {
                return None;
            }
            s.iter().copied().filter(|&b| b != b'-').collect()
        }
        32 => s.to_vec(),
        _ => return None,
    };
    if hex.len() != 32 {
        return None;
    }
    let mut v = [0u8; 16];
    for (i, pair) in hex.chunks(2).enumerate() {
        let hi = (pair[0] as char).to_digit(16)?;
        let lo = (pair[1] as char).to_digit(16)?;
        v[i] = (hi * 16 + lo) as u8;
    }
    Some(v)
}

/// Four decimal octets without leading zeros (ClickHouse reads `01.2.3.4`
/// as 1.2.3.4; that form is left to JSON).
pub(crate) fn ipv4(s: &[u8]) -> Option<u32> {
    let mut v = 0u32;
    let mut parts = 0;
    for part in s.split(|&b| b == b'.') {
        if part.is_empty() || part.len() > 3 || (part.len() > 1 && part[0] == b'0') {
            return None;
        }
        if !part.iter().all(u8::is_ascii_digit) {
            return None;
        }
        let octet: u32 = part.iter().fold(0, |a, d| a * 10 + u32::from(d - b'0'));
        if octet > 255 {
            return None;
        }
        v = v << 8 | octet;
        parts += 1;
    }
    (parts == 4).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_and_addresses() {
        let u = uuid(b"61f0c404-5cb3-11e7-907b-a6006ad3dba0").unwrap();
        assert_eq!(u[0], 0x61);
        assert_eq!(uuid(b"61F0C4045CB311E7907BA6006AD3DBA0"), Some(u));
        assert_eq!(uuid(b"{61f0c404-5cb3-11e7-907b-a6006ad3dba0}"), None);
        assert_eq!(uuid(b"61f0c404-5cb3-11e7-907b-a6006ad3dbaz"), None);
        assert_eq!(ipv4(b"1.2.3.4"), Some(0x01020304));
        assert_eq!(ipv4(b"255.255.255.255"), Some(u32::MAX));
        for bad in ["01.2.3.4", "1.2.3", "256.1.1.1", "1.2.3.4.5", "", "1..2.3"] {
            assert_eq!(ipv4(bad.as_bytes()), None, "{bad}");
        }
    }
}
