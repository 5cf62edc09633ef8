//! Decimal digits → integers up to 256 bits, exact, for the integer and
//! `Decimal` columns.
//!
//! In: a sign and decimal digits. Out: the value's two's complement,
//! little-endian, in the column's width, or `None` when the value is
//! outside the column's range: JSONEachRow wraps an integer that overflows
//! (`128` into `Int8` is `-128`) and refuses `-0` into an unsigned column;
//! the encoder mirrors neither and falls back.

/// A value of up to 256 bits: little-endian 64-bit words.
pub(crate) type Wide = [u64; 4];

/// The magnitude of `digits` (ASCII decimal digits), or `None` past 256 bits.
pub(crate) fn magnitude(digits: &[u8]) -> Option<Wide> {
    let mut w: Wide = [0; 4];
    for &d in digits {
        if !d.is_ascii_digit() {
            return None;
        }
        let mut carry = u128::from(d - b'0');
        for word in w.iter_mut() {
            let v = u128::from(*word) * 10 + carry;
            *word = v as u64;
            carry = v >> 64;
        }
        if carry != 0 {
            return None;
        }
    }
    Some(w)
}

/// Whether `w` < 2^`bits`.
fn below_pow2(w: &Wide, bits: u16) -> bool {
    let bits = usize::from(bits);
    if bits >= 256 {
        return true;
    }
    let (word, bit) = (bits / 64, bits % 64);
    if w[word] >> bit != 0 {
        return false;
    }
    w[word + 1..].iter().all(|&x| x == 0)
}

/// Whether `w` == 2^`bits`.
fn is_pow2(w: &Wide, bits: u16) -> bool {
    let bits = usize::from(bits);
    bits < 256
        && w.iter()
            .enumerate()
            .all(|(i, &x)| x == if i == bits / 64 { 1 << (bits % 64) } else { 0 })
}

/// `-mag` or `mag` as two's complement when it fits a `bits`-bit integer
/// (`signed` or not); `None` otherwise. `-0` fits only a signed one.
pub(crate) fn fit(neg: bool, mag: Wide, bits: u16, signed: bool) -> Option<Wide> {
    if !signed {
        return (!neg && below_pow2(&mag, bits)).then_some(mag);
    }
    let fits = below_pow2(&mag, bits - 1) || (neg && is_pow2(&mag, bits - 1));
    if !fits {
        return None;
    }
    Some(if neg { negate(mag) } else { mag })
}

fn negate(w: Wide) -> Wide {
    let mut out = [0u64; 4];
    let mut carry = 1u128;
    for (o, x) in out.iter_mut().zip(w) {
        let v = u128::from(!x) + carry;
        *o = v as u64;
        carry = v >> 64;
    }
    out
}

/// Writes the low `bits` bits of `w`, little-endian.
pub(crate) fn write_le(w: &Wide, bits: u16, out: &mut Vec<u8>) {
    let bytes = usize::from(bits) / 8;
    let mut all = [0u8; 32];
    for (i, x) in w.iter().enumerate() {
        all[i * 8..i * 8 + 8].copy_from_slice(&x.to_le_bytes());
    }
    out.extend_from_slice(&all[..bytes]);
}

/// The width in bits of a `Decimal` of `precision` digits.
pub(crate) fn decimal_bits(precision: u8) -> u16 {
    match precision {
        0..=9 => 32,
        10..=18 => 64,
        19..=38 => 128,
        _ => 256,
    }
}

/// The scaled value of a decimal number (`int`.`frac`, no exponent) in a
/// `Decimal(precision, scale)`: digits past the scale cut off (toward
/// zero, as ClickHouse reads them), or `None` when the integer part has
/// more digits than `precision - scale` (ClickHouse refuses those).
pub(crate) fn decimal(
    neg: bool,
    int: &[u8],
    frac: &[u8],
    precision: u8,
    scale: u8,
) -> Option<Wide> {
    let int = if int == b"0" { &[][..] } else { int };
    if int.len() > usize::from(precision - scale) {
        return None;
    }
    let scale = usize::from(scale);
    let mut digits = [b'0'; 80];
    let n = int.len() + scale;
    digits[..int.len()].copy_from_slice(int);
    let kept = frac.len().min(scale);
    digits[int.len()..int.len() + kept].copy_from_slice(&frac[..kept]);
    let mag = magnitude(&digits[..n])?;
    let zero = mag == [0; 4];
    fit(neg && !zero, mag, decimal_bits(precision), true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int(text: &str, bits: u16, signed: bool) -> Option<Vec<u8>> {
        let (neg, digits) = match text.strip_prefix('-') {
            Some(d) => (true, d),
            None => (false, text),
        };
        let w = fit(neg, magnitude(digits.as_bytes())?, bits, signed)?;
        let mut out = Vec::new();
        write_le(&w, bits, &mut out);
        Some(out)
    }

    #[test]
    fn integers_at_their_bounds() {
        assert_eq!(int("127", 8, true), Some(vec![127]));
        assert_eq!(int("-128", 8, true), Some(vec![0x80]));
        assert_eq!(int("128", 8, true), None);
        assert_eq!(int("-129", 8, true), None);
        assert_eq!(int("255", 8, false), Some(vec![255]));
        assert_eq!(int("256", 8, false), None);
        assert_eq!(int("-0", 8, false), None);
        assert_eq!(int("-0", 8, true), Some(vec![0]));
        assert_eq!(
            int("-170141183460469231731687303715884105728", 128, true),
            Some(i128::MIN.to_le_bytes().to_vec())
        );
        let max256 =
            "115792089237316195423570985008687907853269984665640564039457584007913129639935";
        assert_eq!(int(max256, 256, false), Some(vec![0xff; 32]));
        assert_eq!(int(&format!("{max256}0"), 256, false), None);
        assert_eq!(int(max256, 256, true), None);
    }

    #[test]
    fn decimals_cut_extra_digits() {
        let d = |neg, i: &str, f: &str, p, s| {
            decimal(neg, i.as_bytes(), f.as_bytes(), p, s).map(|w| {
                let mut out = Vec::new();
                write_le(&w, decimal_bits(p), &mut out);
                out
            })
        };
        assert_eq!(
            d(false, "1", "009", 9, 2),
            Some(100i32.to_le_bytes().to_vec())
        );
        assert_eq!(
            d(true, "1", "009", 9, 2),
            Some((-100i32).to_le_bytes().to_vec())
        );
        assert_eq!(d(true, "0", "001", 9, 2), Some(0i32.to_le_bytes().to_vec()));
        assert_eq!(
            d(false, "9999999", "999", 9, 2),
            Some(999_999_999i32.to_le_bytes().to_vec())
        );
        assert_eq!(d(false, "10000000", "", 9, 2), None);
        assert_eq!(
            d(false, "0", "5", 18, 18),
            Some(500_000_000_000_000_000i64.to_le_bytes().to_vec())
        );
        assert_eq!(d(false, "1", "", 18, 18), None);
    }
}
