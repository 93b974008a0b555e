//! A history as a compact CSV (`seq,action,addr,size,stream,frame,phase`): the GPU truth
//! data's form of a recorded history, and what `scripts/eager_capture.py` writes for a
//! step captured without a GPU (its `workspace` and `workspace_lt` rows).

use super::{bad, Action, RecordedEvent, Recording, Sites, NO_SITE};

impl Recording {
    /// The compact CSV of a history (`seq,action,addr,size,stream,frame`, one event a
    /// row, as the GPU truth data keeps it).
    pub fn from_csv(text: &str) -> std::result::Result<Recording, String> {
        let mut reader = csv::ReaderBuilder::new()
            .flexible(true)
            .from_reader(text.as_bytes());
        let headers = reader.headers().map_err(|e| bad("the history", e))?.clone();
        let col = |name: &str| {
            headers.iter().position(|h| h == name).ok_or_else(|| {
                bad(
                    "the history",
                    format!("no `{name}` column (want action, addr, size)"),
                )
            })
        };
        let (action, addr, size) = (col("action")?, col("addr")?, col("size")?);
        let frame = headers.iter().position(|h| h == "frame");
        let stream = headers.iter().position(|h| h == "stream");
        let phase = headers.iter().position(|h| h == "phase");
        let mut sites = Sites::default();
        let mut events = Vec::new();
        for (i, row) in reader.records().enumerate() {
            let row = row.map_err(|e| bad("the history", e))?;
            let number = |at: usize, what: &str| -> std::result::Result<u64, String> {
                row.get(at).and_then(|v| v.parse().ok()).ok_or_else(|| {
                    bad(
                        "the history",
                        format!("row {}: `{what}` is not a byte count or address", i + 2),
                    )
                })
            };
            let backward = phase.and_then(|p| row.get(p)) == Some("backward");
            events.push(RecordedEvent {
                action: match row.get(action).unwrap_or("") {
                    "workspace" => Action::Workspace {
                        lt: false,
                        backward,
                    },
                    "workspace_lt" => Action::Workspace { lt: true, backward },
                    name => Action::parse(name),
                },
                addr: number(addr, "addr")?,
                size: number(size, "size")?,
                site: frame
                    .and_then(|f| row.get(f))
                    .filter(|f| !f.is_empty())
                    .map_or(NO_SITE, |f| sites.id(f)),
                stream: match stream.and_then(|s| row.get(s)).filter(|s| !s.is_empty()) {
                    Some(_) => number(stream.unwrap_or(0), "stream")?,
                    None => 0,
                },
            });
        }
        Ok(Recording {
            events,
            alloc_conf: None,
            segments_before: 0,
            sites: sites.names,
            gpu: None,
        })
    }
}
