//! The largest batch that fits, as a line: the memory's answer, or the program's bound
//! where it ends the search (a static program's own batch never called the largest).

use std::fmt;

use crate::estimate::Fit;
use crate::format::bytes;

/// How to export a program whose batch can vary, for the lines that need it.
pub(crate) const DYNAMIC_BATCH: &str = "export it with a dynamic batch: \
    torch.export.export(model, args, dynamic_shapes=({0: torch.export.Dim(\"batch\")},))";

impl fmt::Display for Fit {
    /// `largest batch that fits in 79.00 GiB: 428 (peak reserved ..., ... left); batch 429
    /// needs ...`, or that not even batch 1 fits. Where the program bounds the batch
    /// ([`Fit::program_limited`]), the line says so and how to export it for a search:
    /// a static program's own batch is never called the largest that fits.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (first, last) = self.batches.unwrap_or((1, i64::MAX));
        match (&self.fits, self.margin()) {
            (Some(e), Some(margin)) if self.fixed_batch() => write!(
                f,
                "largest batch not searched: the program was exported with static sizes and \
                 takes batch {} only; it fits in {} (peak reserved {}, {} left). A larger \
                 batch may fit: {DYNAMIC_BATCH}",
                self.batch,
                bytes(self.memory),
                bytes(e.peak_reserved),
                bytes(margin)
            ),
            (Some(e), Some(margin)) => {
                write!(
                    f,
                    "largest batch that fits in {}: {} (peak reserved {}, {} left)",
                    bytes(self.memory),
                    self.batch,
                    bytes(e.peak_reserved),
                    bytes(margin)
                )?;
                if let Some(t) = &self.too_big {
                    write!(f, "; batch {} needs {}", t.batch, bytes(t.peak_reserved))?;
                } else if self.program_limited() {
                    write!(
                        f,
                        "; the program takes batches {first} to {last} only (its batch \
                         dimension's range): a larger batch may fit, exported with a larger \
                         range"
                    )?;
                }
                Ok(())
            }
            _ => {
                let needs = self
                    .too_big
                    .as_ref()
                    .map_or("?".to_string(), |t| bytes(t.peak_reserved));
                if self.fixed_batch() {
                    write!(
                        f,
                        "batch {first}, the only batch the program takes (exported with \
                         static sizes), does not fit in {}: it needs {needs} reserved",
                        bytes(self.memory)
                    )
                } else if first > 1 {
                    write!(
                        f,
                        "not even batch {first}, the smallest the program takes, fits in {}: \
                         it needs {needs} reserved",
                        bytes(self.memory)
                    )
                } else {
                    write!(
                        f,
                        "not even batch 1 fits in {}: it needs {needs} reserved",
                        bytes(self.memory)
                    )
                }
            }
        }
    }
}
