//! Which iterations get a step profile, and where it goes: the step the user asked
//! for, and the step with the run's highest peak so far.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::nn::Variables;

use crate::error::Result;
use crate::ffi::{self, TlEvent};
use crate::profiler::ParamSync;
use crate::report;
use crate::timeline::{self, Names, StepProfile, StepStart, VarEntry};

/// Files of one profile, beside the run's CSV files.
#[derive(Debug, Clone)]
pub(crate) struct ProfileFiles {
    pub timeline_csv: PathBuf,
    pub layers_csv: PathBuf,
    pub png: PathBuf,
    pub svg: PathBuf,
}

impl ProfileFiles {
    pub(crate) fn beside(dir: &Path, stem: &str) -> Self {
        ProfileFiles {
            timeline_csv: dir.join(format!("{stem}_timeline.csv")),
            layers_csv: dir.join(format!("{stem}_layers.csv")),
            png: dir.join(format!("{stem}_timeline.png")),
            svg: dir.join(format!("{stem}_timeline.svg")),
        }
    }

    fn write(&self, p: &StepProfile) -> Result<()> {
        p.write_timeline_csv(&self.timeline_csv)?;
        p.write_layers_csv(&self.layers_csv)?;
        let title = format!(
            "Live memory by category, step {} ({}), peak {}",
            p.step,
            p.device,
            crate::format::bytes(p.peak.bytes)
        );
        p.plot(&self.png, Some(&title))?;
        p.plot(&self.svg, Some(&title))
    }
}

pub(crate) struct Capture {
    slot: usize,
    requested_step: Option<u64>,
    print: bool,
    top_layers: usize,
    /// `(dir, stem)` of the run's CSV files; None: no files.
    files: Option<(PathBuf, String)>,
    events: Vec<TlEvent>,
    start: StepStart,
    vars: Vec<VarEntry>,
    names: Names,
    best_peak: i64,
    pub(crate) peak: Option<StepProfile>,
    peak_unwritten: bool,
    pub(crate) requested: Option<StepProfile>,
}

impl Capture {
    pub(crate) fn new(
        slot: usize,
        requested_step: Option<u64>,
        print: bool,
        top_layers: usize,
        files: Option<(PathBuf, String)>,
    ) -> Self {
        Capture {
            slot,
            requested_step,
            print,
            top_layers,
            files,
            events: Vec::new(),
            start: StepStart::default(),
            vars: Vec::new(),
            names: Names::default(),
            best_peak: -1,
            peak: None,
            peak_unwritten: false,
            requested: None,
        }
    }

    /// Classifies what is live at the start of an iteration (call right after the
    /// native iteration began, before any op runs) and refreshes the native table of
    /// variables when the store changed.
    pub(crate) fn begin(&mut self, vars: &Variables, params: &mut ParamSync) -> Result<()> {
        let header = ffi::timeline_header();
        let mut start = StepStart {
            gen: header.start_gen,
            live: header.start_live,
            ..StepStart::default()
        };
        let trainable = crate::profiler::trainable_storages(vars);
        let names = crate::profiler::sorted_names(vars);
        let mut entries = Vec::with_capacity(names.len());
        let mut ptrs = Vec::with_capacity(names.len());
        let mut table_names = Vec::with_capacity(names.len());
        let mut opt_claimed = 0i64;
        for name in names {
            let t = &vars.named_variables[name];
            let w = ffi::tensor_block(t, false)?;
            if w.defined == 0 {
                continue;
            }
            let tracked_here = |b: &ffi::Block| b.tracked != 0 && b.device == self.slot as i32;
            let mut claim = |map: &mut HashMap<u64, i64>, b: &ffi::Block| {
                if tracked_here(b) && map.insert(b.base, b.bytes).is_none() && b.phase == 2 {
                    opt_claimed += b.bytes;
                }
            };
            if trainable.contains(&w.base) {
                claim(&mut start.param, &w);
            } else {
                claim(&mut start.buffer, &w);
            }
            let g = ffi::tensor_block(t, true)?;
            if g.defined != 0 {
                claim(&mut start.grad, &g);
            }
            ptrs.push(w.base);
            table_names.push(name);
            entries.push(VarEntry {
                layer: timeline::layer_of(name),
                bytes: w.bytes.max(0) as u64,
            });
        }
        let ds = ffi::device_stats(self.slot)?;
        start.opt = (ds.optimizer_born_live - opt_claimed).max(0);
        params.update(ptrs, &table_names)?;
        self.vars = entries;
        self.start = start;
        Ok(())
    }

    /// Ends an iteration: builds its profile if it is the requested step or the
    /// highest peak so far. Call before the native iteration ends.
    pub(crate) fn finish(
        &mut self,
        step: u64,
        epoch: u64,
        iteration: u64,
        device: &str,
    ) -> Result<()> {
        let requested = self.requested_step == Some(step);
        let peak_now = ffi::device_stats(self.slot)?.peak_iter;
        let is_peak = peak_now > self.best_peak;
        if !requested && !is_peak {
            return Ok(());
        }
        let overflow = ffi::read_timeline(&mut self.events);
        let mut p = timeline::replay(
            &self.events,
            overflow,
            &self.start,
            self.slot as u8,
            &self.vars,
            &mut self.names,
        );
        p.step = step;
        p.epoch = epoch as usize;
        p.iteration = iteration as usize;
        p.device = device.to_string();
        if is_peak {
            self.best_peak = peak_now;
            self.peak = Some(p.clone());
            self.peak_unwritten = true;
        }
        if requested {
            if self.print {
                report::write_stdout(&report::render_step(
                    &p,
                    "the step asked for with timeline_step",
                    self.top_layers,
                ))?;
            }
            let files = self.files_for(Some(step));
            self.requested = Some(p);
            if let (Some(f), Some(p)) = (files, &self.requested) {
                f.write(p)?;
            }
        }
        Ok(())
    }

    fn files_for(&self, step: Option<u64>) -> Option<ProfileFiles> {
        self.files.as_ref().map(|(dir, stem)| match step {
            Some(s) => ProfileFiles::beside(dir, &format!("{stem}_step{s}")),
            None => ProfileFiles::beside(dir, stem),
        })
    }

    /// The files of the peak step, once written.
    pub(crate) fn peak_files(&self) -> Option<ProfileFiles> {
        self.files_for(None)
    }

    /// Writes (and prints) the peak step's profile if it changed since the last time.
    pub(crate) fn flush_peak(&mut self, print: bool) -> Result<()> {
        if !self.peak_unwritten {
            return Ok(());
        }
        self.peak_unwritten = false;
        let Some(p) = &self.peak else {
            return Ok(());
        };
        if print && self.print {
            report::write_stdout(&report::render_step(
                p,
                "the step with the run's highest peak so far",
                self.top_layers,
            ))?;
        }
        if let Some(f) = self.files_for(None) {
            f.write(p)?;
        }
        Ok(())
    }
}
