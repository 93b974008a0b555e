//! A history as a compact CSV (`seq,action,addr,size,stream,frame,phase`): the GPU truth
//! data's form of a recorded history, and what `scripts/eager_capture.py` writes for a
//! step captured without a GPU (its `workspace` and `workspace_lt` rows, and its `reduce`
//! rows with their `reduction` column).

use super::{bad, Action, RecordedEvent, Recording, Sites, NO_SITE};
use crate::ffi::{self, Reduction};

/// A `reduce` row's `reduction`: `SIZES;STRIDES;OFFSET;DTYPE;OUT_DTYPE;DIMS;KEEPDIM`, the
/// input's sizes and strides (elements, `x` between them, empty for a scalar), its offset
/// into its storage, its dtype and the result's as PyTorch names them (`float32`), the
/// dims reduced (`:` between them; `-` for all), keepdim (`0` or `1`).
fn reduction(text: &str) -> Result<Reduction, String> {
    let parts: Vec<&str> = text.split(';').collect();
    let [sizes, strides, offset, input, output, dims, keepdim] = parts[..] else {
        return Err(format!(
            "`{text}` is not SIZES;STRIDES;OFFSET;DTYPE;OUT_DTYPE;DIMS;KEEPDIM"
        ));
    };
    let list = |t: &str, sep: char, what: &str| -> Result<Vec<i64>, String> {
        t.split(sep)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse()
                    .map_err(|_| format!("{what} `{p}` is not a number"))
            })
            .collect()
    };
    let dtype = |t: &str| ffi::scalar_type(t).ok_or_else(|| format!("`{t}` is not a dtype"));
    let r = Reduction {
        sizes: list(sizes, 'x', "size")?,
        strides: list(strides, 'x', "stride")?,
        offset: offset
            .parse()
            .map_err(|_| format!("offset `{offset}` is not a number"))?,
        input: dtype(input)?,
        output: dtype(output)?,
        dims: match dims {
            "-" => None,
            d => Some(list(d, ':', "dim")?),
        },
        keepdim: match keepdim {
            "0" => false,
            "1" => true,
            k => return Err(format!("keepdim `{k}` is not 0 or 1")),
        },
    };
    let ndim = r.sizes.len() as i64;
    if r.sizes.len() != r.strides.len()
        || r.offset < 0
        || r.sizes.iter().chain(&r.strides).any(|v| *v < 0)
        || r.dims
            .iter()
            .flatten()
            .any(|d| *d >= ndim.max(1) || *d < -ndim.max(1))
    {
        return Err(format!(
            "`{text}` is not a reduction's input (sizes, strides, offset or dims)"
        ));
    }
    // What the checks above let through and libtorch refuses (a dim named twice).
    ffi::reduction_buffers(&r, 1, 2048)
        .map_err(|_| format!("`{text}` is not a reduction PyTorch can make"))?;
    Ok(r)
}

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
        let geometry = headers.iter().position(|h| h == "reduction");
        let mut sites = Sites::default();
        let mut events = Vec::new();
        let mut reductions = Vec::new();
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
                    "reduce" => {
                        let text = geometry.and_then(|g| row.get(g)).unwrap_or("");
                        let r = reduction(text)
                            .map_err(|e| bad("the history", format!("row {}: {e}", i + 2)))?;
                        reductions.push(r);
                        Action::Reduce {
                            index: reductions.len() as u32 - 1,
                        }
                    }
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
            reductions,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::estimate::Gpu;

    const HEADER: &str = "seq,action,addr,size,stream,frame,phase,reduction\n";

    fn read(rows: &str) -> std::result::Result<Recording, String> {
        Recording::from_csv(&format!("{HEADER}{rows}"))
    }

    /// The buffers of each `reduce` row on an NVIDIA H200 (132 multiprocessors) are the
    /// ones its snapshots recorded, request by request, after the same sums of the eager
    /// steps (`tests/data/gpu-truth/h200-2026-12-04/ranks/single.*.pickle.gz`): ViT-B/16's
    /// MLP bias gradients (6,304 tokens) 132 MiB and 96 B, and 38,928,384 B and 24 B;
    /// SmolLM2-135M's RMSNorm weight gradients (4x1024 tokens of 576) 18 MiB and 20 B; a
    /// sum over each token's 576 features splits nothing.
    #[test]
    fn reduce_rows_take_the_buffers_an_h200_took() {
        let recording = read(
            "0,reduce,0,0,0,aten::sum,backward,6304x3072;3072x1;0;float32;float32;0;1\n\
             1,reduce,0,0,0,aten::sum,backward,6304x768;768x1;0;float32;float32;0;1\n\
             2,reduce,0,0,0,aten::sum,backward,4x1024x576;589824x576x1;0;float32;float32;0:1;1\n\
             3,reduce,0,0,0,aten::mean,,4x1024x576;589824x576x1;0;float32;float32;-1;1\n",
        )
        .unwrap();
        assert!(recording.captured());
        let h200 = Gpu::named("h200").unwrap();
        let buffers: Vec<Vec<u64>> = recording
            .reductions
            .iter()
            .map(|r| {
                ffi::reduction_buffers(r, h200.multiprocessors, h200.threads_per_multiprocessor)
                    .unwrap()
            })
            .collect();
        assert_eq!(
            buffers,
            [
                vec![132 << 20, 96],
                vec![38_928_384, 24],
                vec![18 << 20, 20],
                vec![],
            ]
        );
        // In the replay, each is a block taken and freed at once, in that order.
        let mut with = recording.clone();
        with.gpu = Some(h200);
        let sizes: Vec<i64> = with
            .replay_events_at()
            .map(|(_, e)| {
                assert!(matches!(e.kind, crate::events::EventKind::Transient { .. }));
                e.value
            })
            .collect();
        assert_eq!(sizes, [132 << 20, 96, 38_928_384, 24, 18 << 20, 20]);
    }

    /// A `reduce` row the replay cannot size is refused with its row and why.
    #[test]
    fn a_bad_reduction_is_refused_with_its_row() {
        for (geometry, why) in [
            ("6304x768;768x1;0;float32;float32;0", "is not SIZES;STRIDES"),
            (
                "6304x768;768;0;float32;float32;0;1",
                "is not a reduction's input",
            ),
            (
                "6304x768;768x1;0;float32;float32;2;1",
                "is not a reduction's input",
            ),
            (
                "6304x768;768x1;0;floaty;float32;0;1",
                "`floaty` is not a dtype",
            ),
            (
                "6304x768;768x1;0;float32;float32;0:0;1",
                "not a reduction PyTorch can make",
            ),
            (
                "6304x768;768x1;x;float32;float32;0;1",
                "offset `x` is not a number",
            ),
            (
                "6304x768;768x1;0;float32;float32;0;yes",
                "keepdim `yes` is not 0 or 1",
            ),
        ] {
            let err = read(&format!("0,reduce,0,0,0,aten::sum,,{geometry}\n")).unwrap_err();
            assert!(
                err.contains("row 2") && err.contains(why),
                "{geometry}: {err}"
            );
            assert!(!err.contains('\n'), "{err}");
        }
    }
}
