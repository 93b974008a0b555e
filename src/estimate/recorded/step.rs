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
use super::{Action, Recording, NO_SITE};
use crate::error::Result;
use crate::estimate::AllocatorConfig;
use crate::ffi;
use crate::events::{Event, EventKind};
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
        let streams = self.stream_indices();
        let mut events = vec![event(EventKind::Phase, -1, 0, 0, 0)];
        let mut op = 0;
        let mut released = false;
        for e in &self.events {
            released &= e.action == Action::SegmentFree;
            match e.action {
                Action::Alloc => {
                    let (name, module) = match ids.get(&e.site) {
                        Some(id) if e.site != NO_SITE => (*id, *id as u64 + 2),
                        _ => (unnamed, 0),
                    };
                    let mut begin = event(EventKind::OpBegin, op, name, module, -1);
                    begin.generation = 0;
                    events.push(begin);
                    let stream = streams[&e.stream];
                    events.push(event(EventKind::Alloc { stream }, op, 0, e.addr, e.size as i64));
                    events.push(event(EventKind::OpEnd, op, name, 0, 0));
                    op += 1;
                }
                // The replay charges a free the bytes it charged the block.
                Action::FreeCompleted => {
                    events.push(event(EventKind::Free, -1, 0, e.addr, -(e.size as i64)));
                }
                // Segments released one after another: the cache released once.
                Action::SegmentFree if !released => {
                    events.push(event(EventKind::Release, -1, 0, 0, 0));
                    released = true;
                }
                _ => {}
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
