//! JSON lines in: from files or stdin, one record per line.
//!
//! In: paths (`-` or none: stdin). Out: [`Line`]s with where they came from
//! (`file:line`) and the record's text. A line of a retry file written by
//! `sluice send` (`{"sluice_error": …, "record": …}`) yields the record
//! inside it, so a retry file can be sent again as it is. Blank lines are
//! skipped.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;

/// One input record.
#[derive(Debug, Clone)]
pub struct Line {
    /// `file:line`.
    pub source: String,
    /// The record's JSON text.
    pub text: String,
}

/// Reads every line of `paths` in order.
pub fn read_all(paths: &[PathBuf]) -> std::io::Result<Vec<Line>> {
    lines(paths).collect()
}

/// The lines of `paths` in order, as they are read.
pub(crate) fn lines(paths: &[PathBuf]) -> impl Iterator<Item = std::io::Result<Line>> + use<> {
    let paths: Vec<PathBuf> = if paths.is_empty() {
        vec![PathBuf::from("-")]
    } else {
        paths.to_vec()
    };
    paths.into_iter().flat_map(|p| {
        let opened: std::io::Result<(String, Box<dyn BufRead>)> = if p.as_os_str() == "-" {
            Ok(("stdin".into(), Box::new(BufReader::new(std::io::stdin()))))
        } else {
            std::fs::File::open(&p)
                .map(|f| {
                    (
                        p.display().to_string(),
                        Box::new(BufReader::new(f)) as Box<dyn BufRead>,
                    )
                })
                .map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot open {}: {e}", p.display()))
                })
        };
        let (name, reader, err) = match opened {
            Ok((n, r)) => (n, Some(r), None),
            Err(e) => (String::new(), None, Some(e)),
        };
        err.map(Err).into_iter().chain(
            reader
                .into_iter()
                .flat_map(|r| r.lines().enumerate())
                .filter_map(move |(i, line)| match line {
                    Err(e) => Some(Err(std::io::Error::new(
                        e.kind(),
                        format!("reading {name}:{}: {e}", i + 1),
                    ))),
                    Ok(l) if l.trim().is_empty() => None,
                    Ok(l) => Some(Ok(Line {
                        source: format!("{name}:{}", i + 1),
                        text: unwrap_retry(l),
                    })),
                }),
        )
    })
}

/// The record inside a retry-file line; other lines as they are.
fn unwrap_retry(line: String) -> String {
    if !line.contains("\"sluice_error\"") {
        return line;
    }
    match serde_json::from_str::<serde_json::Value>(&line) {
        Ok(serde_json::Value::Object(mut o)) if o.contains_key("sluice_error") => {
            match o.remove("record") {
                // A record that was not JSON is kept as a JSON string.
                Some(serde_json::Value::String(s)) => s,
                Some(v) => v.to_string(),
                None => line,
            }
        }
        _ => line,
    }
}

/// A record's key field as text: a string's contents, a number or boolean
/// as written by ClickHouse's `toString`. Errors name what is wrong.
pub(crate) fn key_of(text: &str, field: &str) -> Result<String, String> {
    let v: serde_json::Value =
        serde_json::from_str(text).map_err(|e| format!("not valid JSON: {e}"))?;
    let obj = v.as_object().ok_or("not a JSON object")?;
    match obj.get(field) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(serde_json::Value::Number(n)) => Ok(match (n.as_u64(), n.as_i64(), n.as_f64()) {
            (Some(u), _, _) => u.to_string(),
            (_, Some(i), _) => i.to_string(),
            (_, _, Some(f)) => f.to_string(),
            _ => n.to_string(),
        }),
        Some(serde_json::Value::Bool(b)) => Ok(b.to_string()),
        Some(other) => Err(format!(
            "key field {field:?} is {other}, not a string or number"
        )),
        None => Err(format!("no key field {field:?}")),
    }
}

/// Checks that a line is one JSON object.
pub(crate) fn check_object(text: &str) -> Result<(), String> {
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err("not a JSON object".into()),
        Err(e) => Err(format!("not valid JSON: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_lines_yield_their_record() {
        let l = r#"{"sluice_error":"timed out","source":"a:1","record":{"id":1}}"#;
        assert_eq!(unwrap_retry(l.into()), r#"{"id":1}"#);
        let bad = r#"{"sluice_error":"not JSON","source":"a:2","record":"{oops"}"#;
        assert_eq!(unwrap_retry(bad.into()), "{oops");
        assert_eq!(unwrap_retry(r#"{"id":2}"#.into()), r#"{"id":2}"#);
    }

    #[test]
    fn keys() {
        assert_eq!(key_of(r#"{"k":"a"}"#, "k").unwrap(), "a");
        assert_eq!(key_of(r#"{"k":17}"#, "k").unwrap(), "17");
        assert_eq!(key_of(r#"{"k":-3}"#, "k").unwrap(), "-3");
        assert!(key_of(r#"{"k":null}"#, "k")
            .unwrap_err()
            .contains("not a string"));
        assert!(key_of(r#"{"x":1}"#, "k")
            .unwrap_err()
            .contains("no key field"));
        assert!(key_of("[1]", "k")
            .unwrap_err()
            .contains("not a JSON object"));
        assert!(check_object("{oops")
            .unwrap_err()
            .contains("not valid JSON"));
    }
}
