//! `<run>_summary.csv`'s rows: the row filled in place from an iteration's numbers, and
//! its line encoded without the csv writer (`report/csv.rs` writes it; the file's first
//! row goes through serde, which writes the header).

use crate::runs::schema::SummaryRow;
use crate::stats::IterationStats;

/// Sets `row`'s fields, but its timestamp, to `s`'s, reusing its device string.
pub(super) fn fill_summary_row(row: &mut SummaryRow, s: &IterationStats) {
    // CUDA runs always have the columns (empty where the statistics could not be read),
    // so that every row of the file has the same fields.
    let on_cuda = s.device.starts_with("cuda");
    let cuda = |f: fn(&crate::cuda::CudaStats) -> i64| on_cuda.then(|| s.cuda.as_ref().map(f));
    if row.device != s.device {
        row.device.clone_from(&s.device);
    }
    *row = SummaryRow {
        timestamp: std::mem::take(&mut row.timestamp),
        epoch: s.epoch,
        iteration: s.iteration,
        device: std::mem::take(&mut row.device),
        allocated_bytes: s.allocated_bytes,
        peak_allocated_bytes: s.peak_allocated_bytes,
        reserved_bytes: s.reserved_bytes,
        peak_reserved_bytes: s.peak_reserved_bytes,
        weights_bytes: s.weights_bytes,
        buffers_bytes: s.buffers_bytes,
        gradients_bytes: s.gradients_bytes,
        feature_maps_bytes: s.feature_maps_bytes,
        intermediate_gradients_bytes: s.intermediate_gradients_bytes,
        optimizer_state_bytes: s.optimizer_state_bytes,
        other_bytes: s.other_bytes,
        step: s.step,
        backward_passes: s.backward_passes,
        cuda_allocated_bytes: cuda(|c| c.allocated_current),
        cuda_peak_allocated_bytes: cuda(|c| c.allocated_peak),
        cuda_reserved_bytes: cuda(|c| c.reserved_current),
        cuda_peak_reserved_bytes: cuda(|c| c.reserved_peak),
        cuda_active_bytes: cuda(|c| c.active_current),
        cuda_peak_active_bytes: cuda(|c| c.active_peak),
        cuda_requested_bytes: cuda(|c| c.requested_current),
        cuda_peak_requested_bytes: cuda(|c| c.requested_peak),
        cuda_alloc_retries: cuda(|c| c.alloc_retries),
        cuda_ooms: cuda(|c| c.ooms),
        cuda_device_free_bytes: cuda(|c| c.free_bytes),
        cuda_device_total_bytes: cuda(|c| c.total_bytes),
        cuda_blas_workspaces_bytes: on_cuda.then_some(Some(s.blas_workspaces_bytes as i64)),
    };
}

/// `row` as the CSV writer encodes a [`SummaryRow`] (`tests` compares them byte for
/// byte), in `line`; `false` (nothing to use) if its text needs quoting, which neither
/// the clock's timestamps nor the device names do. A row is written at every report, in
/// code that the step between two reports leaves cold: encoded here rather than through
/// serde and the csv writer, with a timestamp written without fmt into the kept row, the
/// CSV sink's call runs fewer instructions ([the figures](../../docs/in-a-training-run.md)).
pub(super) fn summary_line(line: &mut Vec<u8>, row: &SummaryRow) -> bool {
    // Every field named: a new one fails the build here until it is written.
    let SummaryRow {
        timestamp,
        epoch,
        iteration,
        device,
        allocated_bytes,
        peak_allocated_bytes,
        reserved_bytes,
        peak_reserved_bytes,
        weights_bytes,
        buffers_bytes,
        gradients_bytes,
        feature_maps_bytes,
        intermediate_gradients_bytes,
        optimizer_state_bytes,
        other_bytes,
        step,
        backward_passes,
        cuda_allocated_bytes,
        cuda_peak_allocated_bytes,
        cuda_reserved_bytes,
        cuda_peak_reserved_bytes,
        cuda_active_bytes,
        cuda_peak_active_bytes,
        cuda_requested_bytes,
        cuda_peak_requested_bytes,
        cuda_alloc_retries,
        cuda_ooms,
        cuda_device_free_bytes,
        cuda_device_total_bytes,
        cuda_blas_workspaces_bytes,
    } = row;
    let plain = |t: &str| !t.bytes().any(|b| matches!(b, b',' | b'"' | b'\n' | b'\r'));
    if !plain(timestamp) || !plain(device) || timestamp.is_empty() {
        return false;
    }
    let mut n = itoa::Buffer::new();
    line.clear();
    line.extend_from_slice(timestamp.as_bytes());
    for v in [epoch, iteration] {
        line.push(b',');
        line.extend_from_slice(n.format(*v).as_bytes());
    }
    line.push(b',');
    line.extend_from_slice(device.as_bytes());
    for v in [
        allocated_bytes,
        peak_allocated_bytes,
        reserved_bytes,
        peak_reserved_bytes,
        weights_bytes,
        buffers_bytes,
        gradients_bytes,
        feature_maps_bytes,
        intermediate_gradients_bytes,
        optimizer_state_bytes,
        other_bytes,
        step,
        backward_passes,
    ] {
        line.push(b',');
        line.extend_from_slice(n.format(*v).as_bytes());
    }
    // Absent on the CPU (no column), empty where the statistics could not be read.
    for v in [
        cuda_allocated_bytes,
        cuda_peak_allocated_bytes,
        cuda_reserved_bytes,
        cuda_peak_reserved_bytes,
        cuda_active_bytes,
        cuda_peak_active_bytes,
        cuda_requested_bytes,
        cuda_peak_requested_bytes,
        cuda_alloc_retries,
        cuda_ooms,
        cuda_device_free_bytes,
        cuda_device_total_bytes,
        cuda_blas_workspaces_bytes,
    ]
    .into_iter()
    .flatten()
    {
        line.push(b',');
        if let Some(v) = v {
            line.extend_from_slice(n.format(*v).as_bytes());
        }
    }
    line.push(b'\n');
    true
}
