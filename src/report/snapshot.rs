//! Memory snapshots in the format of PyTorch's memory viewer (`torch.cuda._memory_viz`,
//! <https://pytorch.org/memory_viz>): a pickled dict with `segments`, `device_traces`,
//! `allocator_settings` and `external_annotations`, as `torch.cuda.memory._snapshot()`
//! returns it.
//!
//! The profiler's own snapshot covers any device, the CPU included: every live block it
//! registered is a segment holding one active block, and the memory history (births
//! and deaths since `start_memory_history`) is the device trace. A block's frame names
//! the op that allocated it and its layer, `{name: op, filename: layer, line:
//! iteration}` (line 0 in the trace, which does not keep the iteration).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::{Error, Result};
use crate::ffi::{HistoryEvent, RegisteredBlock};
use crate::names::Names;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Frame {
    pub filename: String,
    pub line: i64,
    pub name: String,
}

#[derive(Debug, Serialize)]
struct Block {
    address: u64,
    size: u64,
    requested_size: u64,
    state: &'static str,
    frames: Vec<Frame>,
}

#[derive(Debug, Serialize)]
struct Segment {
    device: i64,
    address: u64,
    total_size: u64,
    allocated_size: u64,
    active_size: u64,
    requested_size: u64,
    stream: i64,
    segment_type: &'static str,
    segment_pool_id: (i64, i64),
    is_expandable: bool,
    frames: Vec<Frame>,
    blocks: Vec<Block>,
}

#[derive(Debug, Serialize)]
struct TraceEntry {
    action: &'static str,
    addr: u64,
    size: u64,
    stream: i64,
    time_us: i64,
    frames: Vec<Frame>,
}

#[derive(Debug, Serialize)]
struct Snapshot {
    segments: Vec<Segment>,
    device_traces: Vec<Vec<TraceEntry>>,
    allocator_settings: BTreeMap<String, String>,
    external_annotations: Vec<BTreeMap<String, String>>,
}

fn frame(names: &mut Names, op: i32, layer: i32, line: i64) -> Frame {
    Frame {
        name: names.get(op),
        filename: names.get(layer),
        line,
    }
}

/// Builds the snapshot of device `index` (its position in `device_traces`; the CPU is
/// 0) from the live blocks and the history, and writes it to `path` (atomically).
pub(crate) fn write(
    path: &Path,
    index: usize,
    blocks: &[RegisteredBlock],
    history: &[HistoryEvent],
    device_slot: u8,
    names: &mut Names,
) -> Result<()> {
    let mut segments = Vec::with_capacity(blocks.len());
    let mut sorted: Vec<&RegisteredBlock> = blocks.iter().collect();
    sorted.sort_by_key(|b| b.ptr);
    for b in sorted {
        let size = b.bytes;
        let phase = b.phase.name();
        let iteration = b.iteration;
        let frames = vec![
            frame(names, b.op, b.layer, iteration as i64),
            Frame {
                name: format!("{phase} phase, iteration {iteration}"),
                filename: "tch-memprof".into(),
                line: iteration as i64,
            },
        ];
        segments.push(Segment {
            device: index as i64,
            address: b.ptr,
            total_size: size,
            allocated_size: size,
            active_size: size,
            requested_size: size,
            stream: 0,
            segment_type: if size > 1 << 20 { "large" } else { "small" },
            segment_pool_id: (0, 0),
            is_expandable: false,
            frames: frames.clone(),
            blocks: vec![Block {
                address: b.ptr,
                size,
                requested_size: size,
                state: "active_allocated",
                frames,
            }],
        });
    }
    let mut trace = Vec::new();
    for e in history.iter().filter(|e| e.device == device_slot) {
        let time_us = e.time_us;
        let size = e.bytes;
        let frames = vec![frame(names, e.op, e.layer, 0)];
        if e.alloc {
            trace.push(TraceEntry {
                action: "alloc",
                addr: e.ptr,
                size,
                stream: 0,
                time_us,
                frames,
            });
        } else {
            for action in ["free_requested", "free_completed"] {
                trace.push(TraceEntry {
                    action,
                    addr: e.ptr,
                    size,
                    stream: 0,
                    time_us,
                    frames: frames.clone(),
                });
            }
        }
    }
    let mut device_traces: Vec<Vec<TraceEntry>> = (0..index).map(|_| Vec::new()).collect();
    device_traces.push(trace);
    let snapshot = Snapshot {
        segments,
        device_traces,
        allocator_settings: BTreeMap::new(),
        external_annotations: Vec::new(),
    };
    let bytes = serde_pickle::to_vec(&snapshot, serde_pickle::SerOptions::new()).map_err(|e| {
        Error::Native(format!(
            "{}: pickling the snapshot failed: {e}",
            path.display()
        ))
    })?;
    crate::fs::write_atomic(path, &bytes)
}
