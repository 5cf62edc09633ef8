//! A strict reader of JSON text as bytes, for the binary encoder.
//!
//! In: a row's bytes (valid JSON, except that a string may hold bytes that
//! are not UTF-8, as the registry decoders write them). Out: tokens with
//! the spans they came from: strings unescaped (or borrowed when they hold
//! no escape), numbers as their digits, any value skipped whole. Anything
//! outside strict JSON (a raw control character in a string, an escape JSON
//! does not define, a lone surrogate, nesting deeper than [`MAX_DEPTH`]) is
//! a [`Fallback`]: ClickHouse reads some of those its own way (`"\a"` is
//! `a`, a lone low surrogate becomes three bytes), and the JSON path keeps
//! them exact.

use super::Fallback;

/// How deep arrays and objects may nest in a row.
pub(crate) const MAX_DEPTH: usize = 128;

pub(crate) type R<T> = Result<T, Fallback>;

/// The bytes that end a string's plain run: `"`, `\\` and the control
/// characters (refused raw).
const STOP: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = 0;
    while b < 0x20 {
        t[b] = true;
        b += 1;
    }
    t[b'"' as usize] = true;
    t[b'\\' as usize] = true;
    t
};

pub(crate) fn fb<T>(reason: &'static str) -> R<T> {
    Err(Fallback::new(reason))
}

/// A string's bytes: borrowed from the row, or unescaped into a scratch
/// buffer.
pub(crate) enum Text<'a> {
    Raw(&'a [u8]),
    Scratch,
}

impl<'a> Text<'a> {
    pub(crate) fn get<'s>(&self, scratch: &'s [u8]) -> &'s [u8]
    where
        'a: 's,
    {
        match self {
            Text::Raw(s) => s,
            Text::Scratch => scratch,
        }
    }
}

/// A JSON number's parts, borrowed from the row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Num<'a> {
    pub neg: bool,
    /// The integer digits (`0` alone, or no leading zero).
    pub int: &'a [u8],
    /// The digits after the point (empty without one).
    pub frac: &'a [u8],
    /// Whether there is an exponent.
    pub exp: bool,
    /// The number's whole text.
    pub raw: &'a [u8],
}

impl Num<'_> {
    /// Whether it is an integer in JSON's own form (no point, no exponent).
    pub(crate) fn is_int(&self) -> bool {
        self.frac.is_empty() && !self.exp
    }
}

/// Reads `s` as a whole JSON number (strict grammar), or `None`.
pub(crate) fn number_text(s: &[u8]) -> Option<Num<'_>> {
    if !matches!(s.first(), Some(b'-' | b'0'..=b'9')) {
        return None;
    }
    let mut c = Cursor::new(s);
    let n = c.number().ok()?;
    (c.i == s.len()).then_some(n)
}

pub(crate) struct Cursor<'a> {
    pub s: &'a [u8],
    pub i: usize,
    depth: usize,
}

impl<'a> Cursor<'a> {
    pub(crate) fn new(s: &'a [u8]) -> Self {
        Cursor { s, i: 0, depth: 0 }
    }

    pub(crate) fn at(s: &'a [u8], i: usize) -> Self {
        Cursor { s, i, depth: 0 }
    }

    pub(crate) fn ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte after whitespace, not consumed.
    pub(crate) fn peek(&mut self) -> R<u8> {
        self.ws();
        match self.s.get(self.i) {
            Some(&b) => Ok(b),
            None => fb("the row ends early"),
        }
    }

    pub(crate) fn eat(&mut self, b: u8) -> R<bool> {
        if self.peek()? == b {
            self.i += 1;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    pub(crate) fn expect(&mut self, b: u8) -> R<()> {
        if self.eat(b)? {
            Ok(())
        } else {
            fb("a value not of the column's shape")
        }
    }

    /// `null`, `true` or `false`.
    pub(crate) fn literal(&mut self, lit: &[u8]) -> R<()> {
        self.ws();
        if self.s[self.i..].starts_with(lit) {
            self.i += lit.len();
            Ok(())
        } else {
            fb("a value not of the column's shape")
        }
    }

    /// Whether the next value is `null` (consumed if so).
    pub(crate) fn null(&mut self) -> R<bool> {
        if self.peek()? == b'n' {
            self.literal(b"null")?;
            Ok(true)
        } else {
            Ok(false)
        }
    }

    pub(crate) fn enter(&mut self) -> R<()> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            return fb("the row nests too deep");
        }
        Ok(())
    }

    pub(crate) fn leave(&mut self) {
        self.depth -= 1;
    }

    /// A string, unescaped. With no escape in it, its bytes are borrowed;
    /// else they are written to `scratch` (cleared first).
    pub(crate) fn string(&mut self, scratch: &mut Vec<u8>) -> R<Text<'a>> {
        self.expect(b'"')?;
        let start = self.i;
        let rest = &self.s[start..];
        // Short strings, mostly: a plain loop beats a vectorised search.
        let Some(n) = rest.iter().position(|&b| STOP[usize::from(b)]) else {
            return fb("the row ends in a string");
        };
        self.i = start + n;
        match rest[n] {
            b'"' => {
                self.i += 1;
                return Ok(Text::Raw(&rest[..n]));
            }
            b'\\' => {}
            _ => return fb("a raw control character in a string"),
        }
        scratch.clear();
        scratch.extend_from_slice(&self.s[start..self.i]);
        loop {
            match self.s.get(self.i) {
                None => return fb("the row ends in a string"),
                Some(b'"') => {
                    self.i += 1;
                    return Ok(Text::Scratch);
                }
                Some(b'\\') => self.escape(scratch)?,
                Some(&b) if b < 0x20 => return fb("a raw control character in a string"),
                Some(&b) => {
                    scratch.push(b);
                    self.i += 1;
                }
            }
        }
    }

    /// A string that holds no escape: its bytes, borrowed. (Text that
    /// ClickHouse parses as a number, a time or an address is read from
    /// the raw bytes, escapes not undone.)
    pub(crate) fn plain_string(&mut self) -> R<&'a [u8]> {
        let mut none = Vec::new();
        match self.string(&mut none)? {
            Text::Raw(s) => Ok(s),
            Text::Scratch => fb("an escape in a string read as a value"),
        }
    }

    /// One escape sequence (at `\`), unescaped into `out`.
    fn escape(&mut self, out: &mut Vec<u8>) -> R<()> {
        let c = self.s.get(self.i + 1).copied();
        self.i += 2;
        let b = match c {
            Some(b'"') => b'"',
            Some(b'\\') => b'\\',
            Some(b'/') => b'/',
            Some(b'b') => 0x08,
            Some(b'f') => 0x0c,
            Some(b'n') => b'\n',
            Some(b'r') => b'\r',
            Some(b't') => b'\t',
            Some(b'u') => {
                let hi = self.hex4()?;
                let cp = match hi {
                    0xD800..=0xDBFF => {
                        if self.s.get(self.i..self.i + 2) != Some(b"\\u") {
                            return fb("a lone surrogate escape");
                        }
                        self.i += 2;
                        let lo = self.hex4()?;
                        if !(0xDC00..=0xDFFF).contains(&lo) {
                            return fb("a lone surrogate escape");
                        }
                        0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                    }
                    0xDC00..=0xDFFF => return fb("a lone surrogate escape"),
                    cp => cp,
                };
                let ch = char::from_u32(cp).ok_or_else(|| Fallback::new("a bad \\u escape"))?;
                let mut buf = [0u8; 4];
                out.extend_from_slice(ch.encode_utf8(&mut buf).as_bytes());
                return Ok(());
            }
            _ => return fb("an escape JSON does not define"),
        };
        out.push(b);
        Ok(())
    }

    fn hex4(&mut self) -> R<u32> {
        let digits = self
            .s
            .get(self.i..self.i + 4)
            .ok_or_else(|| Fallback::new("a bad \\u escape"))?;
        let mut v = 0u32;
        for &d in digits {
            let x = (d as char)
                .to_digit(16)
                .ok_or_else(|| Fallback::new("a bad \\u escape"))?;
            v = v * 16 + x;
        }
        self.i += 4;
        Ok(v)
    }

    /// A number in JSON's grammar.
    pub(crate) fn number(&mut self) -> R<Num<'a>> {
        self.ws();
        let start = self.i;
        let neg = self.s.get(self.i) == Some(&b'-');
        if neg {
            self.i += 1;
        }
        let int_start = self.i;
        match self.s.get(self.i) {
            Some(b'0') => self.i += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return fb("not a number"),
        }
        let int = &self.s[int_start..self.i];
        let mut frac: &[u8] = &[];
        if self.s.get(self.i) == Some(&b'.') {
            self.i += 1;
            let f = self.i;
            self.digits();
            if self.i == f {
                return fb("not a number");
            }
            frac = &self.s[f..self.i];
        }
        let mut exp = false;
        if let Some(b'e' | b'E') = self.s.get(self.i) {
            exp = true;
            self.i += 1;
            if let Some(b'+' | b'-') = self.s.get(self.i) {
                self.i += 1;
            }
            let e = self.i;
            self.digits();
            if self.i == e {
                return fb("not a number");
            }
        }
        Ok(Num {
            neg,
            int,
            frac,
            exp,
            raw: &self.s[start..self.i],
        })
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.s.get(self.i) {
            self.i += 1;
        }
    }

    /// Skips one value, checking it; returns its span.
    pub(crate) fn skip(&mut self) -> R<(usize, usize)> {
        let b = self.peek()?;
        let start = self.i;
        match b {
            b'"' => {
                let mut scratch = Vec::new();
                self.string(&mut scratch)?;
            }
            b'{' => {
                self.i += 1;
                self.enter()?;
                if !self.eat(b'}')? {
                    let mut scratch = Vec::new();
                    loop {
                        self.string(&mut scratch)?;
                        self.expect(b':')?;
                        self.skip()?;
                        if !self.eat(b',')? {
                            break;
                        }
                    }
                    self.expect(b'}')?;
                }
                self.leave();
            }
            b'[' => {
                self.i += 1;
                self.enter()?;
                if !self.eat(b']')? {
                    loop {
                        self.skip()?;
                        if !self.eat(b',')? {
                            break;
                        }
                    }
                    self.expect(b']')?;
                }
                self.leave();
            }
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => {
                self.number()?;
            }
        }
        Ok((start, self.i))
    }

    /// Whether only whitespace is left.
    pub(crate) fn at_end(&mut self) -> bool {
        self.ws();
        self.i == self.s.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unescape(s: &[u8]) -> R<Vec<u8>> {
        let mut scratch = Vec::new();
        let mut c = Cursor::new(s);
        let t = c.string(&mut scratch)?;
        Ok(t.get(&scratch).to_vec())
    }

    #[test]
    fn strings_unescape_as_json_defines() {
        assert_eq!(unescape(br#""plain""#).unwrap(), b"plain");
        assert_eq!(
            unescape(br#""a\"b\\c\/d\b\f\n\r\t""#).unwrap(),
            b"a\"b\\c/d\x08\x0c\n\r\t"
        );
        assert_eq!(
            unescape(br#""\u00e9\u4E2D\ud83d\ude00\u0000""#).unwrap(),
            "é中😀\0".as_bytes()
        );
        // Bytes that are not UTF-8 stay as they are.
        assert_eq!(unescape(b"\"\xff\\n\xfe\"").unwrap(), b"\xff\n\xfe");
    }

    #[test]
    fn what_clickhouse_reads_its_own_way_falls_back() {
        for s in [
            &br#""\a""#[..],
            br#""\x41""#,
            br#""\'""#,
            br#""\ud83d""#,
            br#""\ude00""#,
            br#""\ud83d\u0041""#,
            br#""\u12""#,
            b"\"a\nb\"",
            b"\"open",
        ] {
            assert!(unescape(s).is_err(), "{}", String::from_utf8_lossy(s));
        }
    }

    #[test]
    fn numbers_follow_the_grammar() {
        let n = number_text(b"-12.50e+3").unwrap();
        assert!(n.neg && n.exp);
        assert_eq!((n.int, n.frac), (&b"12"[..], &b"50"[..]));
        assert!(number_text(b"0").unwrap().is_int());
        for bad in ["01", "1.", ".5", "+1", "1e", "-", "1.5x", "", " 1"] {
            assert!(number_text(bad.as_bytes()).is_none(), "{bad}");
        }
    }

    #[test]
    fn skip_spans_a_whole_value() {
        let row = br#"  {"a": [1, {"b": "}"}], "c": null}  "#;
        let mut c = Cursor::new(row);
        assert_eq!(c.skip().unwrap(), (2, row.len() - 2));
        assert!(c.at_end());
        let deep = format!("{}{}", "[".repeat(MAX_DEPTH + 1), "]".repeat(MAX_DEPTH + 1));
        assert!(Cursor::new(deep.as_bytes()).skip().is_err());
        let ok = format!("{}{}", "[".repeat(MAX_DEPTH), "]".repeat(MAX_DEPTH));
        assert!(Cursor::new(ok.as_bytes()).skip().is_ok());
    }
}
