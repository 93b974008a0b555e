//! A recorded run as a step the timeline's passes read, as they read a profiled step and
//! a dry run's: one more source of the one event model. A snapshot has no categories and
//! no ops, so each allocation is an op of its own named by where it was asked for (its
//! site, [`Recording::sites`]; `alloc` without frames), and its site is the op's layer
//! (as a TorchScript module path is): the step's files read by frame. Every block is
//! the step's own (what the run held before its history began, seeded from the
//! snapshot's end, included), so the plot shows one band, live bytes over the run's
//! allocations.

use std::collections::HashMap;

use super::super::Options;
use super::Recording;
use crate::error::Result;
use crate::estimate::AllocatorConfig;
use crate::events::{Event, EventKind};
use crate::ffi;
use crate::names::Names;
use crate::phase::Phase;
use crate::replay::{predicted_step, through_allocator, ModelVars};
use crate::timeline::StepProfile;

impl Recording {
    /// The run replayed under `config` as one step of the step timeline (see the
    /// module's docs), titled by the caller when its files are written
    /// ([`write_step_files`](crate::report::write_step_files)).
    pub fn step(&self, config: &AllocatorConfig) -> Result<StepProfile> {
        let unnamed = ffi::intern("alloc")?;
        let mut ids: HashMap<u32, i32> = HashMap::new();
        for (i, site) in self.sites.iter().enumerate() {
            ids.insert(i as u32, ffi::intern(site)?);
        }
        let event = |kind, op: i32, aux: i32, ptr: u64, value: i64| Event {
            kind,
            phase: Phase::Forward,
            device: 0,
            generation: 1,
            op,
            aux,
            ptr,
            value,
        };
        let mut events = vec![event(EventKind::Phase, -1, 0, 0, 0)];
        let mut op = 0;
        // The one replay's events (by stream, the history's releases of the cache), each
        // allocation an op of its own named by its site.
        for (_, e) in self.replay_events_at() {
            if let EventKind::Alloc { .. } = e.kind {
                let (name, module) = match ids.get(&(e.aux as u32).wrapping_sub(1)) {
                    Some(id) if e.aux > 0 => (*id, *id as u64 + 2),
                    _ => (unnamed, 0),
                };
                let mut begin = event(EventKind::OpBegin, op, name, module, -1);
                begin.generation = 0;
                events.push(begin);
                events.push(Event { op, aux: 0, ..e });
                events.push(event(EventKind::OpEnd, op, name, 0, 0));
                op += 1;
            } else {
                // The replay charges a free the bytes it charged the block.
                events.push(e);
            }
        }
        let options = Options {
            allocator: config.clone(),
            ..Options::default()
        };
        let device = through_allocator(&[], &events, &options.device());
        let mut p = predicted_step(
            &device,
            1,
            &ModelVars::default(),
            &mut Names::default(),
            None,
        );
        p.device = "CUDA (recorded)".to_string();
        Ok(p)
    }
}
