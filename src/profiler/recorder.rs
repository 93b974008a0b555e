//! Which iterations get a step profile: the step the user asked for, and the step with
//! the run's highest peak so far. The recorder classifies what is live when an
//! iteration begins and replays its step log when it ends; the profiler hands the
//! profiles to its reports.

use rustc_hash::FxHashMap;

use crate::error::Result;
use crate::events::Event;
use crate::ffi::{self, Records, StepLogStart};
use crate::names::Names;
use crate::vars::VarTable;

use super::template::{self, Template};
use crate::replay::replay_step as replay;
use crate::timeline::sites::SiteNames;
use crate::timeline::{StepProfile, StepStart, VarEntry};

pub(crate) struct Recorder {
    slot: usize,
    requested_step: Option<u64>,
    /// The requested step is profiled with its detail (op reads, allocation sites): the
    /// blocks idle at its peak.
    idle: bool,
    /// Whether the iteration running now has its detail on.
    detail: bool,
    events: Vec<Event>,
    /// The last learning iteration's log, for the iterations that record no op.
    template: Template,
    merged: Vec<Event>,
    start: StepStart,
    vars: Vec<VarEntry>,
    names: Names,
    best_peak: i64,
    peak: Option<StepProfile>,
    peak_unreported: bool,
    requested: Option<StepProfile>,
}

impl Recorder {
    pub(crate) fn new(slot: usize, requested_step: Option<u64>, idle: bool) -> Self {
        Recorder {
            slot,
            requested_step,
            idle: idle && requested_step.is_some(),
            detail: false,
            events: Vec::new(),
            template: Template::default(),
            merged: Vec::new(),
            start: StepStart::default(),
            vars: Vec::new(),
            names: Names::default(),
            best_peak: -1,
            peak: None,
            peak_unreported: false,
            requested: None,
        }
    }

    /// Classifies what is live at the start of an iteration (step `step`, from 1) and
    /// turns its detail on or off. Call right after the native iteration began, before
    /// any op runs, with the store's variables.
    pub(crate) fn begin(&mut self, vars: &VarTable, step: u64) -> Result<()> {
        let detail = self.idle && self.requested_step == Some(step);
        if detail || self.detail {
            self.detail = false;
            ffi::set_detail(detail)?;
            self.detail = detail;
        }
        let header = ffi::step_log_start()?;
        // The maps and the variables' list are kept from the last iteration and refilled:
        // this runs every step, and building them anew cost allocations and rehashing.
        let start = &mut self.start;
        start.generation = header.generation;
        start.live = header.live;
        start.opt = 0;
        for m in [
            &mut start.param,
            &mut start.buffer,
            &mut start.grad,
            &mut start.workspace,
        ] {
            m.clear();
        }
        start.device_owned.clear();
        let mut opt_claimed = 0i64;
        let slot = self.slot;
        let mut claim = |map: &mut FxHashMap<u64, i64>, b: &ffi::TensorBlock| {
            let bytes = b.bytes as i64;
            if b.tracked_on(slot) && map.insert(b.base, bytes).is_none() && b.born_in_optimizer() {
                opt_claimed += bytes;
            }
        };
        let same_vars = self.vars.len() == vars.len();
        if !same_vars {
            self.vars.clear();
        }
        for (k, (v, block, grad)) in vars.rows().enumerate() {
            if v.trainable {
                claim(&mut start.param, &block);
            } else {
                claim(&mut start.buffer, &block);
            }
            if grad.defined {
                claim(&mut start.grad, &grad);
            }
            let bytes = block.bytes;
            match self.vars.get_mut(k) {
                Some(e) if same_vars => {
                    if e.layer != v.layer {
                        e.layer.clone_from(&v.layer);
                    }
                    e.bytes = bytes;
                }
                _ => self.vars.push(VarEntry {
                    layer: v.layer.clone(),
                    bytes,
                }),
            }
        }
        // CUDA: the cuBLAS workspaces PyTorch holds are WORKSPACE, those the session saw
        // born counted at the start (the others are not in its live bytes).
        for w in self.workspaces() {
            self.start.device_owned.insert(w.address);
            if w.seen_born {
                self.start.workspace.insert(w.address, w.bytes as i64);
            }
        }
        let ds = ffi::device_stats(self.slot)?;
        self.start.opt = (ds.optimizer_born_live - opt_claimed).max(0);
        Ok(())
    }

    /// The cuBLAS and cuBLASLt workspaces PyTorch holds on the profiled CUDA device (none
    /// on the CPU, or where they cannot be read: they stay OTHER then).
    fn workspaces(&self) -> Vec<ffi::BlasWorkspace> {
        if self.slot == 0 {
            return Vec::new();
        }
        let mut ws = ffi::cuda_workspaces().unwrap_or_default();
        ws.retain(|w| w.device + 1 == self.slot);
        ws
    }

    /// Ends an iteration: builds its profile if it is the requested step or the
    /// highest peak so far. Call before the native iteration ends. Returns the
    /// requested step's profile when this was that step.
    pub(crate) fn finish(
        &mut self,
        step: u64,
        epoch: u64,
        iteration: u64,
        device: &str,
    ) -> Result<Option<&StepProfile>> {
        let requested = self.requested_step == Some(step);
        let peak_now = ffi::device_stats(self.slot)?.peak_iter;
        let (records, learning) = ffi::step_log_records()?;
        // A peak profile without ops gives way to the same peak with them.
        let is_peak = peak_now > self.best_peak
            || (peak_now == self.best_peak
                && records != Records::After
                && self.peak.as_ref().is_some_and(|p| !p.ops_recorded));
        let learned = learning && records == Records::All;
        if !requested && !is_peak && !learned {
            return Ok(None);
        }
        let overflow = ffi::read_timeline(&mut self.events)?;
        let log_start = StepLogStart {
            generation: self.start.generation,
            live: self.start.live,
        };
        if learned {
            self.template.keep(&self.events, log_start, overflow);
        }
        if !requested && !is_peak {
            return Ok(None);
        }
        let mut ops_recorded = true;
        match records {
            Records::All => {}
            Records::None => {
                if self
                    .template
                    .merge(&self.events, &log_start, &mut self.merged)
                {
                    std::mem::swap(&mut self.events, &mut self.merged);
                } else {
                    template::without_ops(&mut self.events);
                    ops_recorded = false;
                    ffi::relearn()?;
                }
            }
            // The ops that began after it parted, recorded from their start (with their
            // inputs); those before are not known.
            Records::After => ops_recorded = false,
        }
        // Workspaces taken during the step (the first matrix products of a thread) are
        // WORKSPACE from their birth.
        for w in self.workspaces() {
            self.start.device_owned.insert(w.address);
        }
        let mut sites = (requested && self.detail).then(SiteNames::new);
        let mut name = |aux: i32| sites.as_mut().map_or_else(String::new, |s| s.name(aux));
        let mut p = replay(
            &self.events,
            overflow,
            &self.start,
            self.slot as u8,
            &self.vars,
            &mut self.names,
            (requested && self.detail).then_some(&mut name as &mut dyn FnMut(i32) -> String),
        );
        p.ops_recorded = ops_recorded;
        p.step = step;
        p.epoch = epoch;
        p.iteration = iteration;
        p.device = device.to_string();
        if is_peak {
            self.best_peak = peak_now;
            self.peak = Some(p.clone());
            self.peak_unreported = true;
        }
        if requested {
            self.requested = Some(p);
            return Ok(self.requested.as_ref());
        }
        Ok(None)
    }

    /// The peak step's profile if it changed since it was last taken.
    pub(crate) fn take_new_peak(&mut self) -> Option<&StepProfile> {
        if !std::mem::take(&mut self.peak_unreported) {
            return None;
        }
        self.peak.as_ref()
    }

    pub(crate) fn requested(&self) -> Option<&StepProfile> {
        self.requested.as_ref()
    }

    pub(crate) fn peak(&self) -> Option<&StepProfile> {
        self.peak.as_ref()
    }
}
