//! JSON lines → records in the schema registry's wire format, for topics
//! that `avro` and `protobuf` routes read.
//!
//! In: `--format avro|protobuf`, the schema file (`.avsc` or `.proto`) and
//! a registry. The schema is registered under the subject (`<topic>-value`
//! by default; the registry answers the id it already has for the same
//! schema). Out: a [`Framing`] that turns each line into the magic byte,
//! the id and the payload (Protobuf: the message indexes, then the
//! message). A line that does not fit the schema goes to the retry file
//! with the reason, as a line that is not JSON does.

use crate::config::{RawConfig, SchemaRegistryConfig};
use crate::registry::Registry;
use anyhow::{bail, Context};
use sluice_formats::avro::AvroSchema;
use sluice_formats::protobuf::ProtoSchema;
use sluice_formats::wire::write_header;
use std::path::{Path, PathBuf};

/// `sluice send`'s and `sluice resend`'s format flags.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct FormatArgs {
    /// How records are written: `json` (each line as it is), or `avro` or
    /// `protobuf` in the schema registry's wire format.
    #[arg(long, default_value = "json", value_parser = ["json", "avro", "protobuf"])]
    pub(crate) format: String,
    /// The schema to write with: an Avro schema (`.avsc`, JSON) or a
    /// `.proto` file (self-contained; the well-known types may be imported).
    #[arg(long, value_name = "FILE")]
    pub(crate) schema: Option<PathBuf>,
    /// Protobuf: the message type, by name or full name (default: the
    /// file's first).
    #[arg(long)]
    pub(crate) message: Option<String>,
    /// The schema registry. Default: `[schema_registry]` of --config, then
    /// SCHEMA_REGISTRY_URL.
    #[arg(long, value_name = "URL")]
    pub(crate) registry: Option<String>,
    /// The subject to register the schema under. Default `<topic>-value`.
    #[arg(long)]
    pub(crate) subject: Option<String>,
}

/// How each line is written.
#[derive(Debug)]
pub struct Framing {
    /// The registry's id of the schema.
    pub(crate) id: u32,
    codec: Codec,
}

#[derive(Debug)]
enum Codec {
    Avro(AvroSchema),
    /// The schema and the message indexes of the message type.
    Protobuf(ProtoSchema, Vec<i32>),
}

impl Framing {
    /// Parses `text`, a schema of `format` (`avro` or `protobuf`, with
    /// `message` naming the Protobuf message type), and registers it under
    /// `subject`.
    pub async fn register(
        registry: &SchemaRegistryConfig,
        subject: &str,
        format: &str,
        text: &str,
        message: Option<&str>,
    ) -> anyhow::Result<Framing> {
        let (codec, kind) = match format {
            "avro" => (Codec::Avro(AvroSchema::parse(text, &[])?), "AVRO"),
            "protobuf" => {
                let s = ProtoSchema::parse(text, &[])?;
                let at = s.path_of(message).context("--message")?;
                (Codec::Protobuf(s, at), "PROTOBUF")
            }
            other => bail!("{other} is not a registry format (avro or protobuf)"),
        };
        let id = Registry::new(registry)?
            .register(subject, text, kind)
            .await
            .with_context(|| format!("registering the schema under subject {subject:?}"))?;
        Ok(Framing { id, codec })
    }

    /// The record value for one JSON line, or why the line does not fit.
    pub fn frame(&self, text: &str) -> Result<Vec<u8>, String> {
        let mut out = Vec::with_capacity(text.len());
        write_header(self.id, &mut out);
        let payload = match &self.codec {
            Codec::Avro(s) => s.from_json(text).map_err(|e| e.to_string())?,
            Codec::Protobuf(s, path) => s.from_json(path, text).map_err(|e| e.to_string())?,
        };
        out.extend_from_slice(&payload);
        Ok(out)
    }
}

impl FormatArgs {
    /// The framing these flags ask for (`None`: JSON), with the schema
    /// registered; `config`: `--config`, whose `[schema_registry]` is used.
    pub(crate) async fn framing(
        &self,
        topic: &str,
        config: Option<&Path>,
    ) -> anyhow::Result<Option<Framing>> {
        if self.format == "json" {
            if self.schema.is_some() || self.message.is_some() {
                bail!("--schema and --message are for --format avro or protobuf");
            }
            return Ok(None);
        }
        let path = self
            .schema
            .as_deref()
            .with_context(|| format!("--format {} needs --schema FILE", self.format))?;
        let text = std::fs::read_to_string(path)
            .with_context(|| format!("cannot read --schema {}", path.display()))?;
        if self.format == "avro" && self.message.is_some() {
            bail!("--message is for --format protobuf");
        }
        let cfg = self.registry_config(config)?;
        let subject = self
            .subject
            .clone()
            .unwrap_or_else(|| format!("{topic}-value"));
        Framing::register(&cfg, &subject, &self.format, &text, self.message.as_deref())
            .await
            .with_context(|| format!("--schema {}", path.display()))
            .map(Some)
    }

    fn registry_config(&self, config: Option<&Path>) -> anyhow::Result<SchemaRegistryConfig> {
        let from_file = match config {
            Some(p) => RawConfig::load(p, std::env::vars())?.registry_side()?,
            None => None,
        };
        let env = std::env::var("SCHEMA_REGISTRY_URL")
            .ok()
            .filter(|u| !u.is_empty());
        match (self.registry.clone(), from_file, env) {
            (Some(url), Some(mut c), _) => {
                c.url = url.trim_end_matches('/').to_string();
                Ok(c)
            }
            (Some(url), None, _) | (None, None, Some(url)) => {
                Ok(SchemaRegistryConfig::from_url(&url))
            }
            (None, Some(c), _) => Ok(c),
            (None, None, None) => bail!(
                "--format {} needs a schema registry: --registry URL, [schema_registry] in --config, or SCHEMA_REGISTRY_URL",
                self.format
            ),
        }
    }
}
