//! The job's log on stderr: plain text, or JSON lines (`--log-format json`) whose every line
//! carries the job's name and instance, the fields of the event (a checkpoint's id among
//! them) and of the spans it happened in. librdkafka's own log reaches the same output
//! (the `rdkafka` crate logs through `log`, which tracing-subscriber forwards).

use std::fmt;

use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{JsonFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// How the job writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines (in colour on a terminal without `NO_COLOR`).
    #[default]
    Text,
    /// One JSON object per line: `timestamp`, `level`, `target`, `message`, `job`,
    /// `instance` (scaled out), the event's fields and its spans' fields.
    Json,
}

/// The JSON line format: static `job` and `instance` fields beside each event's own.
pub(crate) struct JsonLines {
    pub(crate) job: String,
    pub(crate) instance: Option<String>,
}

impl<S, N> FormatEvent<S, N> for JsonLines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut line = Map::new();
        line.insert("timestamp".into(), Value::String(humantime_now()));
        line.insert("level".into(), Value::String(meta.level().to_string()));
        line.insert("target".into(), Value::String(meta.target().to_string()));
        line.insert("job".into(), Value::String(self.job.clone()));
        if let Some(i) = &self.instance {
            line.insert("instance".into(), Value::String(i.clone()));
        }
        // the spans' fields, outermost first, so an inner span's field wins
        if let Some(scope) = ctx.event_scope() {
            let mut names = Vec::new();
            for span in scope.from_root() {
                names.push(Value::String(span.name().to_string()));
                let ext = span.extensions();
                if let Some(fields) = ext.get::<FormattedFields<JsonFields>>() {
                    if let Ok(Value::Object(m)) = serde_json::from_str::<Value>(fields) {
                        line.extend(m);
                    }
                }
            }
            line.insert("spans".into(), Value::Array(names));
        }
        let mut visitor = JsonVisitor(&mut line);
        event.record(&mut visitor);
        // a `log` record (librdkafka's, through the rdkafka crate): its own target, not the
        // bridge's, and none of the bridge's location fields
        if meta.target() == "log" {
            if let Some(Value::String(t)) = line.remove("log.target") {
                line.insert("target".into(), Value::String(t));
            }
            for k in ["log.file", "log.line", "log.module_path"] {
                line.remove(k);
            }
        }
        let text = serde_json::to_string(&line).map_err(|_| fmt::Error)?;
        writeln!(writer, "{text}")
    }
}

/// The event's fields into the line (`message` included).
struct JsonVisitor<'a>(&'a mut Map<String, Value>);

impl Visit for JsonVisitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().into(), Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0
            .insert(field.name().into(), Value::String(value.into()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.0.insert(field.name().into(), Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().into(), Value::from(value));
    }
}

/// Now as RFC 3339 UTC with microseconds (the text format's timestamp).
fn humantime_now() -> String {
    let mut s = String::new();
    let mut w = Writer::new(&mut s);
    let _ = tracing_subscriber::fmt::time::FormatTime::format_time(
        &tracing_subscriber::fmt::time::SystemTime,
        &mut w,
    );
    s
}
