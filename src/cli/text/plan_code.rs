//! A plan as code to apply: the lines of a tch training loop, and of a PyTorch one for a
//! file PyTorch wrote, that pull its levers in the order the estimate ran them.

use crate::estimate::{every_segment, Optimizer, Plan};

/// How to apply it in a tch training loop, a line per lever: the optimizer first
/// (the loop uses it), then the loop.
pub(crate) fn tch_code(plan: &Plan, asked: Optimizer) -> Vec<String> {
    let mut out = Vec::new();
    if !plan.config.allocator_conf.is_empty() {
        out.push(format!(
            "export PYTORCH_CUDA_ALLOC_CONF={}",
            plan.config.allocator_conf
        ));
    }
    if plan.config.optimizer != asked {
        out.push(format!(
            "let mut opt = {}.build(&vs, lr)?;",
            optimizer_code(plan.config.optimizer)
        ));
    }
    let k = plan.config.accumulate;
    let last = k.saturating_sub(1);
    let micro = plan.micro_batch;
    match plan.config.checkpoint {
        // The chain under `Checkpointed`, which runs autocast itself; one call does
        // forward and backward, so gradients go to none before it.
        Some(every) => {
            let wrap = if every <= 1 {
                "c.segment(move |x: &Tensor, t: bool| segment(i, x, t))".to_string()
            } else {
                format!("{{ let f = move |x: &Tensor, t: bool| segment(i, x, t); if i % {every} == 0 {{ c.segment(f) }} else {{ c.segment_kept(f) }} }}")
            };
            let amp = plan
                .config
                .autocast
                .map_or(String::new(), |d| format!(".mixed_precision(Kind::{d:?})"));
            out.push(
                "// segment(i, x, train): segment i of your chain, segments: how many (a built-in: Chain::segment, Chain::segments)".to_string(),
            );
            out.push("let segment = &segment;".to_string());
            out.push(format!(
                "let model = (0..segments).fold(tch_memprof::Checkpointed::new(&vs), |c, i| {wrap}){amp};"
            ));
            out.push(if k > 1 {
                format!("for (i, xs) in micro_batches.enumerate() {{ if i % {k} == 0 {{ opt.zero_grad(); }} model.forward_backward(&xs, |out| loss_fn(out) / {k}.)?; if i % {k} == {last} {{ opt.step(); }} }}  // micro-batches of {micro}")
            } else {
                "opt.zero_grad(); let loss = model.forward_backward(&xs, |out| loss_fn(out))?; opt.step();".to_string()
            });
        }
        None => {
            let forward = match plan.cost.lower_precision {
                Some(d) => format!("tch_memprof::autocast(Device::Cuda(0), Kind::{d:?}, || loss_fn(&model.forward_t(&xs, true)))?"),
                None if plan.config.autocast.is_some() => "/* your autocast */ loss_fn(&model.forward_t(&xs, true))".to_string(),
                None => "loss_fn(&model.forward_t(&xs, true))".to_string(),
            };
            // The loop the estimate ran: gradients set to none before the forward
            // pass or after it, one micro-batch on the GPU at a time, one optimizer
            // step per batch.
            let changed = plan.cost.lower_precision.is_some() || plan.cost.zero_grad_moved;
            if k > 1 {
                out.push(if plan.config.zero_grad_first {
                    format!("for (i, xs) in micro_batches.enumerate() {{ if i % {k} == 0 {{ opt.zero_grad(); }} let loss = {forward} / {k}.; loss.backward(); if i % {k} == {last} {{ opt.step(); }} }}  // micro-batches of {micro}")
                } else {
                    format!("for (i, xs) in micro_batches.enumerate() {{ let loss = {forward} / {k}.; if i % {k} == 0 {{ opt.zero_grad(); }} loss.backward(); if i % {k} == {last} {{ opt.step(); }} }}  // micro-batches of {micro}")
                });
            } else if changed {
                out.push(if plan.config.zero_grad_first {
                    format!("opt.zero_grad(); let loss = {forward}; loss.backward(); opt.step();  // gradients to none before the forward pass")
                } else {
                    format!("let loss = {forward}; opt.backward_step(&loss);")
                });
            }
        }
    }
    out
}

/// How to apply it in a PyTorch training loop (a file PyTorch wrote runs from its
/// module there), a line each, indented as Python reads them; empty where the plan is
/// the step as it is. `model`, `opt`, `loss_fn`, `x` and `micro_batches` are the
/// user's.
pub(crate) fn pytorch_code(plan: &Plan, asked: Optimizer) -> Vec<String> {
    let mut out = Vec::new();
    if !plan.config.allocator_conf.is_empty() {
        out.push(format!(
            "export PYTORCH_CUDA_ALLOC_CONF={}  # before Python starts, or os.environ before torch's first CUDA call",
            plan.config.allocator_conf
        ));
    }
    if plan.config.optimizer != asked {
        out.push(format!(
            "opt = {}",
            match plan.config.optimizer {
                Optimizer::Sgd => "torch.optim.SGD(model.parameters(), lr=lr)",
                Optimizer::SgdMomentum =>
                    "torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)",
                Optimizer::Adam => "torch.optim.Adam(model.parameters(), lr=lr)",
                Optimizer::AdamW => "torch.optim.AdamW(model.parameters(), lr=lr)",
            }
        ));
    }
    let k = plan.config.accumulate;
    let amp = plan.cost.lower_precision.map(|d| match d {
        tch::Kind::BFloat16 => "torch.bfloat16",
        _ => "torch.float16",
    });
    let changed =
        amp.is_some() || plan.cost.zero_grad_moved || plan.config.checkpoint.is_some() || k > 1;
    if !changed {
        return out;
    }
    let forward = match plan.config.checkpoint {
        Some(every) => format!(
            "loss_fn(forward_checkpointed(x))  # {} block under torch.utils.checkpoint.checkpoint(block, h, use_reentrant=False)",
            every_segment(every).replace("segment", "block")
        ),
        None => "loss_fn(model(x))".to_string(),
    };
    let scale = if k > 1 {
        format!(" / {k}")
    } else {
        String::new()
    };
    // The loop the estimate ran, in the order of tch's: gradients set to none before
    // the forward pass, or between it and the backward pass (the previous step's
    // gradients then stay live through the forward pass).
    let (indent, zero_grad) = if k > 1 {
        out.push(format!(
            "for i, x in enumerate(micro_batches):  # {k} micro-batches of {} a step",
            plan.micro_batch
        ));
        (
            "    ",
            vec![
                format!("    if i % {k} == 0:"),
                "        opt.zero_grad(set_to_none=True)".to_string(),
            ],
        )
    } else {
        ("", vec!["opt.zero_grad(set_to_none=True)".to_string()])
    };
    if plan.config.zero_grad_first {
        out.extend(zero_grad.iter().cloned());
    }
    match amp {
        Some(dtype) => {
            out.push(format!(
                "{indent}with torch.autocast(\"cuda\", dtype={dtype}):"
            ));
            out.push(format!("{indent}    loss = {forward}{scale}"));
        }
        None => out.push(format!("{indent}loss = {forward}{scale}")),
    }
    if !plan.config.zero_grad_first {
        out.extend(zero_grad);
    }
    out.push(format!("{indent}loss.backward()"));
    if k > 1 {
        out.push(format!("    if i % {k} == {}:", k - 1));
        out.push("        opt.step()".to_string());
    } else {
        out.push("opt.step()".to_string());
    }
    out
}

fn optimizer_code(o: Optimizer) -> &'static str {
    match o {
        Optimizer::Sgd => "nn::Sgd::default()",
        Optimizer::SgdMomentum => "nn::Sgd { momentum: 0.9, ..Default::default() }",
        Optimizer::Adam => "nn::Adam::default()",
        Optimizer::AdamW => "nn::AdamW::default()",
    }
}
