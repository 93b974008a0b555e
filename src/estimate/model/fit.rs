//! The largest batch that fits a memory: peaks only while searching, the whole estimate
//! of the batch found.

use super::{Analysis, Model};
use crate::error::{Error, Result};
use crate::estimate::{Estimate, Fit, Input, Mode, Options};

impl Model {
    /// The largest batch whose predicted peak reserved fits in `memory` (default: the
    /// GPU's usable memory, [`Gpu::usable`](crate::estimate::Gpu::usable)): batches 1, 2, 4, ... until one does not
    /// fit, then a bisection between the last two. An exported program is searched
    /// within the batches it takes ([`Model::batch_range`]): from its range's first,
    /// doubling up to its last (a static program: its own batch only).
    pub fn largest_batch(
        &self,
        inputs: &[Input],
        mode: Mode,
        options: &Options,
        memory: Option<u64>,
    ) -> Result<Fit> {
        let memory = match memory {
            Some(m) => m,
            None => options.gpu.usable().ok_or_else(|| Error::InvalidInput {
                name: "memory",
                value: options.gpu.name.clone(),
                reason: "this GPU's memory is unknown: give the memory (80GiB) or a GPU name"
                    .into(),
            })?,
        };
        const MAX_BATCH: i64 = 1 << 24;
        let mut tries = 0;
        let at_batch = |b: i64| -> Vec<Input> { inputs.iter().map(|i| i.with_batch(b)).collect() };
        // The search needs the peaks only; the batch found gets the whole estimate.
        let mut at = |b: i64| -> Result<Estimate> {
            tries += 1;
            let xs = at_batch(b);
            let run = self.dry_run(&xs, mode, options, false)?;
            self.replayed(&run, &xs, mode, options, Analysis::Peak)
        };
        let mut fits: Option<Estimate> = None;
        let mut too_big: Option<Estimate> = None;
        let range = self.batch_range();
        let (first, last) = range.unwrap_or((1, MAX_BATCH));
        let last = last.min(MAX_BATCH);
        let mut b = first;
        loop {
            let e = at(b)?;
            if e.peak_reserved <= memory {
                fits = Some(e);
                if b >= last {
                    break;
                }
                b = b.saturating_mul(2).min(last);
            } else {
                too_big = Some(e);
                break;
            }
        }
        if let (Some(lo), Some(hi)) = (&fits, &too_big) {
            let (mut lo_b, mut hi_b) = (lo.batch, hi.batch);
            while hi_b - lo_b > 1 {
                let mid = lo_b + (hi_b - lo_b) / 2;
                let e = at(mid)?;
                if e.peak_reserved <= memory {
                    lo_b = mid;
                    fits = Some(e);
                } else {
                    hi_b = mid;
                    too_big = Some(e);
                }
            }
        }
        if let Some(e) = &fits {
            fits = Some(self.estimate(&at_batch(e.batch), mode, options)?);
        }
        Ok(Fit {
            memory,
            batch: fits.as_ref().map_or(0, |e| e.batch),
            fits,
            too_big,
            tries,
            // A range from 1 reaching past the search's own bound bounds nothing.
            batches: range.filter(|&(lo, hi)| lo > 1 || hi < MAX_BATCH),
        })
    }
}
