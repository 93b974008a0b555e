//! A sharded estimate as a person reads it: each rank's peaks, then what each holds at
//! its peak by category.

use comfy_table::CellAlignment;

use crate::estimate::{
    mixed_dtype_name, Ddp, Fsdp, GpuPlans, RankEstimate, ShardedCategory, Sharding, MOST_GPUS,
};
use crate::format::bytes;

/// The ranks' peaks and their categories at the peak, with what the estimate does not
/// see.
pub fn sharded(ranks: &[RankEstimate], fsdp: &Fsdp) -> String {
    let mut out = String::new();
    let mut t = crate::report::table();
    let mut header = vec!["".to_string()];
    header.extend(ranks.iter().map(|r| format!("rank {}", r.rank)));
    t.set_header(header);
    let mut row = |name: &str, f: &dyn Fn(&RankEstimate) -> u64| {
        let mut cells = vec![name.to_string()];
        cells.extend(ranks.iter().map(|r| bytes(f(r))));
        t.add_row(cells);
    };
    row("peak allocated", &|r| r.peak_allocated);
    row("peak reserved", &|r| r.peak_reserved);
    categories(ranks, &mut row);
    row("sharded params (requested)", &|r| r.sharded_parameter_bytes);
    row("optimizer state (requested)", &|r| r.optimizer_state_bytes);
    for c in 1..=ranks.len() {
        if let Some(col) = t.column_mut(c) {
            col.set_cell_alignment(CellAlignment::Right);
        }
    }
    crate::report::keep_words(&mut t);
    let units = ranks.first().map_or(&[][..], |r| &r.units[..]);
    let unit_words = match units {
        [] => "none but the root".to_string(),
        [one] => format!("{one} and the root"),
        [first, .., last] => format!("{} ({first} to {last}) and the root", units.len()),
    };
    out.push_str(&format!(
        "FSDP2 over {} ({}); units: {unit_words}; the categories are held at allocated's peak\n",
        ranks_words(fsdp.world),
        match (fsdp.reshard_after_forward, fsdp.reshard_root) {
            (true, true) => "resharded after forward, the root too",
            (true, false) => "resharded after forward, the root kept",
            (false, true) => "units kept unsharded until backward, the root resharded",
            (false, false) => "kept unsharded until backward",
        },
    ));
    if let Some(k) = fsdp.param_dtype {
        out.push_str(&format!(
            "mixed precision: units gathered and computed in {}, gradients reduced in {}; \
             shards and optimizer state in the parameters' dtype\n",
            mixed_dtype_name(k),
            mixed_dtype_name(fsdp.reduce_dtype.unwrap_or(k)),
        ));
    } else if let Some(k) = fsdp.reduce_dtype {
        out.push_str(&format!(
            "mixed precision: gradients reduced in {}\n",
            mixed_dtype_name(k)
        ));
    }
    if units.is_empty() {
        out.push_str(
            "warning: the model has no repeated module list: it is one unit, the root, \
             gathered whole (name units with --fsdp-units)\n",
        );
    }
    out.push_str(&t.to_string());
    out.push('\n');
    out.push_str(
        "not counted: NCCL's own buffers (outside PyTorch's allocator; leave room for them)\n\
         held to an H200 (docs/estimate.md): what sharding adds; the rest of a rank's peak is the \
         one-GPU estimate's, as close to your model's run as that is\n",
    );
    out
}

/// The categories at the peak, those some rank holds bytes of.
/// A table's row: its label, and a rank's bytes.
type Row<'a> = dyn FnMut(&str, &dyn Fn(&RankEstimate) -> u64) + 'a;

fn categories(ranks: &[RankEstimate], row: &mut Row<'_>) {
    if let Some(first) = ranks.first() {
        for (k, (cat, _)) in first.at_peak.iter().enumerate() {
            let bytes = |r: &RankEstimate| r.at_peak.get(k).map_or(0, |c| c.1);
            if ranks.iter().all(|r| bytes(r) == 0) {
                continue;
            }
            row(&format!("  {}", cat.name()), &bytes);
        }
    }
}

/// A DDP rank's peaks and what it holds at its peak.
pub fn replicated(rank: &RankEstimate, ddp: &Ddp) -> String {
    let mut t = crate::report::table();
    t.set_header(vec!["", "every rank"]);
    let ranks = std::slice::from_ref(rank);
    let mut row = |name: &str, f: &dyn Fn(&RankEstimate) -> u64| {
        t.add_row(vec![name.to_string(), bytes(f(rank))]);
    };
    row("peak allocated", &|r| r.peak_allocated);
    row("peak reserved", &|r| r.peak_reserved);
    categories(ranks, &mut row);
    if let Some(col) = t.column_mut(1) {
        col.set_cell_alignment(CellAlignment::Right);
    }
    crate::report::keep_words(&mut t);
    format!(
        "DDP over {} (buckets of 25 MiB, gradients {}); the categories are held at allocated's peak\n{t}\n\
         not counted: NCCL's own buffers (outside PyTorch's allocator; leave room for them)\n\
         held to an H200 (docs/estimate.md): what DDP adds; the rest of a rank's peak is the \
         one-GPU estimate's, as close to your model's run as that is\n",
        ranks_words(ddp.world),
        if ddp.gradient_as_bucket_view {
            "as views into them"
        } else {
            "copied into them"
        }
    )
}

/// `plan --gpus N`: every sharding plan, cheapest first, with its largest rank's peak
/// reserved, whether it fits, its communication; the cheapest that fits and the fewest
/// GPUs it fits on.
pub fn gpu_plans(plans: &GpuPlans) -> String {
    let mut t = crate::report::table();
    t.set_header(vec![
        "#",
        "plan",
        "peak reserved a rank",
        "fits",
        "cost a step",
    ]);
    for (i, p) in plans.plans.iter().enumerate() {
        let mut name = match p.sharding {
            Sharding::Ddp => "DDP".to_string(),
            Sharding::FsdpKept => "FSDP2 kept unsharded".to_string(),
            Sharding::Fsdp => "FSDP2".to_string(),
        };
        let mut cost = vec![
            p.collectives.clone(),
            format!("a rank sends {}", bytes(p.traffic)),
        ];
        if p.mixed {
            name.push_str(" + bf16 mixed precision");
            cost.push("bf16 numerics".into());
        }
        if p.checkpoint {
            name.push_str(" + checkpointing");
            cost.push("forward run twice".into());
        }
        let fits = if p.peak_reserved <= plans.memory {
            format!("yes, {} left", bytes(plans.memory - p.peak_reserved))
        } else {
            format!("no, {} over", bytes(p.peak_reserved - plans.memory))
        };
        t.add_row(vec![
            (i + 1).to_string(),
            name,
            bytes(p.peak_reserved),
            fits,
            cost.join("; "),
        ]);
    }
    if let Some(col) = t.column_mut(2) {
        col.set_cell_alignment(CellAlignment::Right);
    }
    crate::report::keep_words(&mut t);
    let mut out = format!("{t}\n");
    match (plans.cheapest, plans.fewest) {
        (Some(i), Some(fewest)) => {
            let p = &plans.plans[i];
            out.push_str(&format!(
                "cheapest that fits on {} GPUs: plan {} ({} per rank reserved); of the powers of two tried, it fits on {} GPU{} or more\n",
                plans.gpus,
                i + 1,
                bytes(p.peak_reserved),
                fewest,
                if fewest == 1 { "" } else { "s" }
            ));
        }
        _ => {
            let least = plans
                .plans
                .iter()
                .map(|p| p.peak_reserved)
                .min()
                .unwrap_or(0);
            out.push_str(&format!(
                "nothing fits on {} GPUs: the smallest rank needs {} reserved, {} over the budget\n",
                plans.gpus,
                bytes(least),
                bytes(least.saturating_sub(plans.memory))
            ));
            let lean = plans
                .plans
                .iter()
                .position(|p| p.peak_reserved == least)
                .map_or(0, |i| i + 1);
            match plans.more {
                Some(Some((world, peak))) => out.push_str(&format!(
                    "with more GPUs: plan {lean} fits on {world} ({} per rank reserved; of the powers of two tried); rerun with --gpus {world} for the cheapest there\n",
                    bytes(peak)
                )),
                Some(None) => out.push_str(&format!(
                    "with more GPUs: plan {lean} does not fit on up to {MOST_GPUS} either (a rank's activations do not shrink with more GPUs): a smaller --batch or --input\n"
                )),
                None => {}
            }
        }
    }
    out.push_str(
        "not counted: NCCL's own buffers (outside PyTorch's allocator; leave room for them); \
         what sharding adds is held to an H200, the rest of a rank's peak is the one-GPU \
         estimate's (docs/estimate.md)\n",
    );
    out
}

/// A row of `estimate --fsdp N --csv` or `--ddp N --csv`: a rank's peaks, and what it
/// holds at its peak allocated by category (the bytes the caching allocator charges).
#[derive(serde::Serialize)]
pub(crate) struct RankRow<'a> {
    model: &'a str,
    mode: String,
    /// `fsdp` or `ddp`.
    parallel: &'static str,
    world: u32,
    rank: u32,
    peak_allocated_bytes: u64,
    peak_reserved_bytes: u64,
    parameters_bytes: u64,
    sharded_parameters_bytes: u64,
    buffers_bytes: u64,
    gradient_buckets_bytes: u64,
    unsharded_parameters_bytes: u64,
    all_gather_bytes: u64,
    unsharded_gradients_bytes: u64,
    reduce_scatter_bytes: u64,
    sharded_gradients_bytes: u64,
    optimizer_state_bytes: u64,
    other_bytes: u64,
}

/// `r`'s CSV row.
pub(crate) fn rank_row<'a>(
    r: &RankEstimate,
    model: &'a str,
    mode: crate::estimate::Mode,
    parallel: &'static str,
    world: u32,
) -> RankRow<'a> {
    let at = |c: ShardedCategory| {
        r.at_peak
            .iter()
            .find(|(k, _)| *k == c)
            .map_or(0, |(_, b)| *b)
    };
    RankRow {
        model,
        mode: mode.label(),
        parallel,
        world,
        rank: r.rank,
        peak_allocated_bytes: r.peak_allocated,
        peak_reserved_bytes: r.peak_reserved,
        parameters_bytes: at(ShardedCategory::Parameters),
        sharded_parameters_bytes: at(ShardedCategory::ShardedParameters),
        buffers_bytes: at(ShardedCategory::Buffers),
        gradient_buckets_bytes: at(ShardedCategory::Buckets),
        unsharded_parameters_bytes: at(ShardedCategory::UnshardedParameters),
        all_gather_bytes: at(ShardedCategory::AllGather),
        unsharded_gradients_bytes: at(ShardedCategory::UnshardedGradients),
        reduce_scatter_bytes: at(ShardedCategory::ReduceScatter),
        sharded_gradients_bytes: at(ShardedCategory::ShardedGradients),
        optimizer_state_bytes: at(ShardedCategory::OptimizerState),
        other_bytes: at(ShardedCategory::Other),
    }
}

/// `1 rank`, `8 ranks`.
fn ranks_words(world: u32) -> String {
    match world {
        1 => "1 rank".to_string(),
        n => format!("{n} ranks"),
    }
}
