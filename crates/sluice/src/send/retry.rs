//! The retry file: every record `sluice send` could not confirm.
//!
//! In: a record, where it came from and why it was not confirmed. Out: one
//! JSON line appended to the file, `{"sluice_error", "source", "record"}`,
//! flushed before the tool reports. `sluice send` and `sluice resend` read
//! such a file back as plain records.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

pub(crate) struct RetryFile {
    path: PathBuf,
    out: Option<BufWriter<File>>,
    pub(crate) written: u64,
}

impl RetryFile {
    /// Opens lazily: no file appears unless a record needs it.
    pub(crate) fn new(path: &Path) -> Self {
        Self {
            path: path.to_path_buf(),
            out: None,
            written: 0,
        }
    }

    /// Appends one record with its error.
    pub(crate) fn add(&mut self, source: &str, record: &str, error: &str) -> std::io::Result<()> {
        if self.out.is_none() {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.path)
                .map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot open the retry file {}: {e}", self.path.display()),
                    )
                })?;
            self.out = Some(BufWriter::new(f));
        }
        let record: serde_json::Value = serde_json::from_str(record)
            .unwrap_or_else(|_| serde_json::Value::String(record.to_string()));
        let line = serde_json::json!({
            "sluice_error": error,
            "source": source,
            "record": record,
        });
        if let Some(out) = self.out.as_mut() {
            serde_json::to_writer(&mut *out, &line)?;
            out.write_all(b"\n")?;
        }
        self.written += 1;
        Ok(())
    }

    /// Makes everything written durable.
    pub(crate) fn finish(&mut self) -> std::io::Result<()> {
        if let Some(out) = self.out.as_mut() {
            out.flush()?;
            out.get_ref().sync_all()?;
        }
        Ok(())
    }
}
