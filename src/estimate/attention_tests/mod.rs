//! `scaled_dot_product_attention` in the dry run: the backend PyTorch 2.11's CUDA build
//! picks (sdp_utils.cpp, rule by rule) and the bytes each fused kernel allocates (from
//! the CUDA sources, written out by hand below).

use std::sync::Mutex;

use tch::{Device, Kind, Tensor};

use super::{Attention, Gpu, Input, Mode, Model, Optimizer, Options};
use crate::events::EventKind;
use crate::ffi;

mod workspaces;

/// One meta trace at a time in this process.
static SERIAL: Mutex<()> = Mutex::new(());

const FLASH: &str = "flash";
const EFFICIENT: &str = "efficient";
const CUDNN: &str = "cudnn";
const MATH: &str = "math";

fn meta(shape: &[i64], kind: Kind, grad: bool) -> Tensor {
    let like = Tensor::empty([0], (kind, Device::Cpu));
    let t = ffi::meta_empty(shape, &like).unwrap();
    if grad {
        t.set_requires_grad(true)
    } else {
        t
    }
}

/// A call of `scaled_dot_product_attention`.
#[derive(Clone, Copy)]
struct Call {
    sm: i32,
    kind: Kind,
    /// batch, query heads, key/value heads, query length, key length, head size.
    b: i64,
    h: i64,
    hk: i64,
    l: i64,
    s: i64,
    d: i64,
    mask: bool,
    dropout: f64,
    causal: bool,
    gqa: bool,
    grad: bool,
}

const BASE: Call = Call {
    sm: 80,
    kind: Kind::Half,
    b: 2,
    h: 4,
    hk: 4,
    l: 100,
    s: 100,
    d: 64,
    mask: false,
    dropout: 0.0,
    causal: false,
    gqa: false,
    grad: false,
};

/// Runs `c` (and its backward when `c.grad`) in a meta trace with `backend`: the
/// allocations (bytes, in order; frees as negative bytes) and the backend that ran.
fn run(c: Call, backend: Attention) -> Result<(Vec<i64>, &'static str), String> {
    let (events, ran) = run_events(c, backend)?;
    let bytes = events
        .iter()
        .filter(|e| e.is_block())
        .map(|e| e.value)
        .collect();
    Ok((bytes, ran))
}

/// The same, every event of the trace.
fn run_events(
    c: Call,
    backend: Attention,
) -> Result<(Vec<crate::events::Event>, &'static str), String> {
    ffi::meta_attention_set(c.sm, backend.backend()).unwrap();
    ffi::meta_begin().unwrap();
    let result = crate::error::catching(|| {
        let q = meta(&[c.b, c.h, c.l, c.d], c.kind, c.grad);
        let k = meta(&[c.b, c.hk, c.s, c.d], c.kind, c.grad);
        let v = meta(&[c.b, c.hk, c.s, c.d], c.kind, c.grad);
        let mask = c.mask.then(|| meta(&[c.l, c.s], Kind::Bool, false));
        let out = Tensor::scaled_dot_product_attention(
            &q, &k, &v, mask, c.dropout, c.causal, None, c.gqa,
        );
        if c.grad {
            out.sum(c.kind).backward();
        }
    });
    let mut events = Vec::new();
    ffi::meta_read(&mut events).unwrap();
    ffi::meta_end().unwrap();
    result?;
    let runs = ffi::meta_attention_runs().unwrap();
    let ran = match runs {
        [1, 0, 0, 0] => FLASH,
        [0, 1, 0, 0] => EFFICIENT,
        [0, 0, 1, 0] => CUDNN,
        [0, 0, 0, 1] => MATH,
        other => panic!("one call, runs {other:?}"),
    };
    Ok((events, ran))
}

fn picks(c: Call) -> &'static str {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    run(c, Attention::Auto).unwrap().1
}

/// `want` appears in `got` in this order (other allocations between them).
fn subsequence(got: &[i64], want: &[i64]) -> bool {
    let mut it = got.iter();
    want.iter().all(|w| it.any(|g| g == w))
}

#[test]
fn the_backend_is_the_one_sdp_utils_selects() {
    // (case, expected). The rule each case exercises, from sdp_utils.cpp (2.11):
    let cases: Vec<(Call, &str, &str)> = vec![
        // sm80, f16, d 64, no mask: flash first in the default order; all of its checks pass.
        (BASE, FLASH, "sm80 f16 d64"),
        (
            Call {
                kind: Kind::BFloat16,
                ..BASE
            },
            FLASH,
            "sm80 bf16 d64",
        ),
        // check_dtypes_low_precision: flash takes f16/bf16 only; mem-efficient takes f32
        // on sm80+.
        (
            Call {
                kind: Kind::Float,
                ..BASE
            },
            EFFICIENT,
            "sm80 f32",
        ),
        // check_head_dim_size_flash: q, k, v head sizes <= 256 (the composite pads to 8).
        (Call { d: 256, ..BASE }, FLASH, "sm80 f16 d256"),
        (Call { d: 80, ..BASE }, FLASH, "sm80 f16 d80"),
        (Call { d: 20, ..BASE }, FLASH, "sm80 f16 d20 (padded)"),
        // d 257: flash > 256; mem-efficient needs d % 8 == 0 for f16 (minimum_gemm_alignment).
        (Call { d: 257, ..BASE }, MATH, "sm80 f16 d257"),
        // f32 d 257: mem-efficient alignment 4 on sm80 -> no; math.
        (
            Call {
                d: 257,
                kind: Kind::Float,
                ..BASE
            },
            MATH,
            "sm80 f32 d257",
        ),
        // f32 d 130: 130 % 4 != 0 -> math; d 132 -> efficient.
        (
            Call {
                d: 130,
                kind: Kind::Float,
                ..BASE
            },
            MATH,
            "sm80 f32 d130",
        ),
        (
            Call {
                d: 132,
                kind: Kind::Float,
                ..BASE
            },
            EFFICIENT,
            "sm80 f32 d132",
        ),
        // check_for_attn_mask: flash takes no mask; mem-efficient does.
        (Call { mask: true, ..BASE }, EFFICIENT, "sm80 f16 mask"),
        // Dropout: flash and mem-efficient both take it.
        (
            Call {
                dropout: 0.1,
                grad: true,
                ..BASE
            },
            FLASH,
            "sm80 f16 dropout",
        ),
        // check_flash_causal_non_square_seqlens.
        (
            Call {
                causal: true,
                s: 60,
                ..BASE
            },
            EFFICIENT,
            "sm80 causal L != S",
        ),
        (
            Call {
                causal: true,
                ..BASE
            },
            FLASH,
            "sm80 causal L == S",
        ),
        // GQA: flash checks batch and heads with supports_gqa; mem-efficient in 2.11 does
        // not (check_batch_size_and_num_heads_dense<false>).
        (
            Call {
                hk: 2,
                gqa: true,
                ..BASE
            },
            FLASH,
            "sm80 f16 gqa",
        ),
        (
            Call {
                hk: 2,
                gqa: true,
                kind: Kind::Float,
                ..BASE
            },
            MATH,
            "sm80 f32 gqa",
        ),
        // sm75: flash needs [sm80, sm121]; mem-efficient dtypes below sm80 are f16, f32.
        (Call { sm: 75, ..BASE }, EFFICIENT, "sm75 f16"),
        (
            Call {
                sm: 75,
                kind: Kind::Float,
                ..BASE
            },
            EFFICIENT,
            "sm75 f32",
        ),
        (
            Call {
                sm: 75,
                kind: Kind::BFloat16,
                ..BASE
            },
            MATH,
            "sm75 bf16",
        ),
        // sm75 f32: no tensor cores -> alignment 1, d 257 is fine for mem-efficient.
        (
            Call {
                sm: 75,
                kind: Kind::Float,
                d: 257,
                ..BASE
            },
            EFFICIENT,
            "sm75 f32 d257",
        ),
        // check_requires_grad_and_head_dim_gt192_constraints_on_sm86_89_or_120.
        (
            Call {
                sm: 86,
                d: 256,
                grad: true,
                ..BASE
            },
            FLASH,
            "sm86 d256 train",
        ),
        (
            Call {
                sm: 86,
                d: 256,
                grad: true,
                dropout: 0.1,
                ..BASE
            },
            EFFICIENT,
            "sm86 d256 train dropout",
        ),
        (
            Call {
                sm: 89,
                d: 200,
                grad: true,
                ..BASE
            },
            EFFICIENT,
            "sm89 d200 train",
        ),
        (
            Call {
                sm: 89,
                d: 200,
                ..BASE
            },
            FLASH,
            "sm89 d200 inference",
        ),
        (
            Call {
                sm: 80,
                d: 200,
                grad: true,
                ..BASE
            },
            FLASH,
            "sm80 d200 train",
        ),
        // check_prefer_cudnn_attention: sm90 puts cuDNN first (cuDNN 9.19 > 9.15).
        (Call { sm: 90, ..BASE }, CUDNN, "sm90 f16 d64"),
        (
            Call {
                sm: 90,
                kind: Kind::BFloat16,
                d: 128,
                ..BASE
            },
            CUDNN,
            "sm90 bf16 d128",
        ),
        // check_cudnn_tensor_shapes: d <= 256 on sm90, multiples of 8.
        (
            Call {
                sm: 90,
                d: 256,
                ..BASE
            },
            CUDNN,
            "sm90 f16 d256",
        ),
        (
            Call {
                sm: 90,
                d: 20,
                ..BASE
            },
            FLASH,
            "sm90 f16 d20",
        ),
        (
            Call {
                sm: 90,
                d: 257,
                ..BASE
            },
            MATH,
            "sm90 f16 d257",
        ),
        (
            Call {
                sm: 90,
                mask: true,
                ..BASE
            },
            CUDNN,
            "sm90 f16 mask",
        ),
        // check_dtypes_low_precision for cuDNN and flash: f32 goes to mem-efficient.
        (
            Call {
                sm: 90,
                kind: Kind::Float,
                ..BASE
            },
            EFFICIENT,
            "sm90 f32",
        ),
        // sm89 is not cuDNN-preferred: flash.
        (Call { sm: 89, ..BASE }, FLASH, "sm89 f16"),
        // sm70 (V100): f32 mem-efficient, alignment 1.
        (
            Call {
                sm: 70,
                kind: Kind::Float,
                d: 80,
                ..BASE
            },
            EFFICIENT,
            "sm70 f32 d80",
        ),
    ];
    for (c, want, what) in cases {
        assert_eq!(picks(c), want, "{what}");
    }
}

#[test]
fn a_forced_backend_the_inputs_do_not_allow_is_one_line_naming_it_and_why() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let err = run(
        Call {
            kind: Kind::Float,
            ..BASE
        },
        Attention::Flash,
    )
    .unwrap_err();
    assert!(
        err.contains("attention flash") && err.contains("f16 or bf16"),
        "{err}"
    );
    assert!(!err.contains('\n'), "{err}");
    let err = run(Call { mask: true, ..BASE }, Attention::Flash).unwrap_err();
    assert!(err.contains("attn_mask"), "{err}");
    // Forced math runs the reference path.
    assert_eq!(run(BASE, Attention::Math).unwrap().1, MATH);
}

#[test]
fn flash_allocates_what_flash_api_allocates() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // f16, B 2, H 4, L 100, S 60, head size 20 (padded to 24 by the composite).
    let c = Call {
        s: 60,
        d: 20,
        grad: true,
        ..BASE
    };
    let (bytes, ran) = run(c, Attention::Auto).unwrap();
    assert_eq!(ran, FLASH);
    let (b, h, l, s, dp) = (2, 4, 100, 60, 24);
    let q_padded = b * h * l * dp * 2;
    let kv_padded = b * h * s * dp * 2;
    let out = b * l * h * dp * 2; // mha_fwd: empty_like(q) in [B, L, H, D]
    let lse = b * h * l * 4; // f32 [B, H, L]
    let rng_state = 2 * 8; // u64 [2]
    let unused = 8; // u64 []
    let forward = [q_padded, kv_padded, kv_padded, out, lse, rng_state, unused];
    assert!(subsequence(&bytes, &forward), "{bytes:?}");
    // mha_bwd: dq, dk, dv; softmax_d f32 [B, H, round128(L)]; dq_accum f32
    // [B, round128(L), H, round32(24)]; both freed before the op returns.
    let softmax_d = b * h * 128 * 4;
    let dq_accum = b * 128 * h * 32 * 4;
    let backward = [
        q_padded, kv_padded, kv_padded, softmax_d, dq_accum, -dq_accum, -softmax_d,
    ];
    assert!(subsequence(&bytes, &backward), "{bytes:?}");
    // No B x H x L x S scores, in any dtype.
    for elem in [1, 2, 4] {
        assert!(!bytes.contains(&(b * h * l * s * elem)), "{bytes:?}");
    }
}

#[test]
fn flash_with_fewer_key_heads_expands_dk_dv_in_backward() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Call {
        hk: 2,
        gqa: true,
        s: 60,
        grad: true,
        ..BASE
    };
    let (bytes, ran) = run(c, Attention::Auto).unwrap();
    assert_eq!(ran, FLASH);
    // dk_expanded, dv_expanded: [B, S, H, D] in f16, freed after the sum into dk, dv.
    let expanded = 2 * 60 * 4 * 64 * 2;
    let dq_accum = 2 * 128 * 4 * 64 * 4;
    assert!(
        subsequence(
            &bytes,
            &[dq_accum, expanded, expanded, -expanded, -expanded]
        ),
        "{bytes:?}"
    );
}

#[test]
fn efficient_allocates_what_the_cutlass_kernels_allocate() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // f32 on sm80: mem-efficient. B 2, H 4, L 100, S 60, D 16.
    let c = Call {
        kind: Kind::Float,
        s: 60,
        d: 16,
        grad: true,
        ..BASE
    };
    let (bytes, ran) = run(c, Attention::Auto).unwrap();
    assert_eq!(ran, EFFICIENT);
    let res = 2 * 100 * 4 * 16 * 4; // [B, L, H, Dv]
    let lse = 2 * 4 * 128 * 4; // f32 [B, H, ceil(100 / 32) * 32]
    let gq = res;
    let gkv = 2 * 60 * 4 * 16 * 4;
    let delta = 2 * 4 * 100 * 4; // f32 [B, H, L], freed on return
    assert!(
        subsequence(&bytes, &[res, lse, gq, gkv, gkv, delta, -delta]),
        "{bytes:?}"
    );
    // f16 with Dv 160 > 128: the f32 output accumulator [B, L, H, Dv], freed on return;
    // no logsumexp rows without grad (compute_log_sumexp false).
    let c = Call {
        sm: 80,
        d: 160,
        mask: true,
        b: 1,
        h: 2,
        hk: 2,
        l: 50,
        s: 64,
        ..BASE
    };
    let (bytes, ran) = run(c, Attention::Auto).unwrap();
    assert_eq!(ran, EFFICIENT);
    let res = 50 * 2 * 160 * 2;
    let accum = 50 * 2 * 160 * 4;
    assert!(subsequence(&bytes, &[res, accum, -accum]), "{bytes:?}");
}

#[test]
fn cudnn_allocates_output_stats_and_seeds() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let c = Call {
        sm: 90,
        s: 60,
        grad: true,
        ..BASE
    };
    let (bytes, ran) = run(c, Attention::Auto).unwrap();
    assert_eq!(ran, CUDNN);
    let out = 2 * 100 * 4 * 64 * 2;
    let lse = 2 * 4 * 100 * 4; // f32 [B, H, L, 1]
    let dkv = 2 * 4 * 60 * 64 * 2;
    assert!(
        subsequence(&bytes, &[8, 8, out, lse, out, dkv, dkv]),
        "{bytes:?}"
    );
    // The forward's workspace: 256 B, the request every cuDNN attention forward made in
    // the H200's snapshots (tests/data/gpu-truth/h200-2026-11-27/snapshots/traced/, the
    // bf16 training runs of GPT-2, BERT-base, SmolLM2 and ViT-B: 132 calls), taken
    // before the loss's sum and backward take theirs.
    let (events, _) = run_events(c, Attention::Auto).unwrap();
    let first = events
        .iter()
        .find(|e| matches!(e.kind, EventKind::Transient { .. }));
    assert_eq!(first.map(|e| e.value), Some(256));
}

#[test]
fn outside_a_dry_run_attention_is_unchanged() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ffi::meta_attention_set(90, Attention::Flash.backend()).unwrap();
    // A CPU call in f32 with a forced flash setting: the composite path, same numbers as
    // the math written out.
    let q = Tensor::randn([1, 2, 5, 8], (Kind::Float, Device::Cpu));
    let k = Tensor::randn([1, 2, 5, 8], (Kind::Float, Device::Cpu));
    let v = Tensor::randn([1, 2, 5, 8], (Kind::Float, Device::Cpu));
    let out =
        Tensor::scaled_dot_product_attention(&q, &k, &v, None::<Tensor>, 0.0, false, None, false);
    let scores = q.matmul(&k.transpose(-2, -1)) / (8f64).sqrt();
    let want = scores.softmax(-1, Kind::Float).matmul(&v);
    assert!(out.allclose(&want, 1e-5, 1e-6, false));
    assert_eq!(ffi::meta_attention_runs().unwrap(), [0, 0, 0, 0]);
    ffi::meta_attention_set(80, Attention::Auto.backend()).unwrap();
}

#[test]
fn gpt2_trained_in_f32_on_an_h100_holds_no_score_block_and_math_is_the_old_upper_bound() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let model = Model::builtin("gpt2").unwrap();
    let input = Input::new(&[2, 1024], Kind::Int64);
    let mode = Mode::Train(Optimizer::AdamW);
    let auto = Options {
        steps: 1,
        ..Options::for_gpu(Gpu::named("h100").unwrap())
    };
    let math = Options {
        attention: Attention::Math,
        ..auto.clone()
    };
    // 2 x 12 heads x 1024 x 1024 f32 scores: the block the math path makes (scores,
    // probabilities) in every layer.
    let scores = 2 * 12 * 1024 * 1024 * 4;
    let blocks = |o: &Options| {
        let run = model
            .dry_run(std::slice::from_ref(&input), mode, o, false)
            .unwrap();
        run.events
            .iter()
            .filter(|e| e.is_alloc() && e.value >= scores)
            .map(|e| e.value)
            .collect::<Vec<i64>>()
    };
    let auto_blocks = blocks(&auto);
    assert!(!auto_blocks.contains(&scores), "auto: {auto_blocks:?}");
    let math_blocks = blocks(&math);
    let n = math_blocks.iter().filter(|b| **b == scores).count();
    assert!(n >= 2 * 12, "math: {n} score blocks: {math_blocks:?}");
    let e_auto = model
        .estimate(std::slice::from_ref(&input), mode, &auto)
        .unwrap();
    let e_math = model
        .estimate(std::slice::from_ref(&input), mode, &math)
        .unwrap();
    // f32 on sm90: cuDNN and flash take f16/bf16 only; mem-efficient, in all 12 layers.
    assert_eq!(e_auto.attention.efficient, 12);
    assert_eq!(e_auto.attention.label(), "efficient");
    assert_eq!(e_math.attention.label(), "math");
    // At the peak (backward begins), each of the 12 layers holds for backward on the math
    // path its softmax probabilities [2, 12, 1024, 1024] f32, and on the mem-efficient
    // path its logsumexp [2, 12, ceil(1024 / 32) * 32] f32 instead; the rest is the same.
    let lse = 2 * 12 * 1024 * 4;
    assert_eq!(
        e_math.peak_allocated - e_auto.peak_allocated,
        12 * (scores - lse) as u64,
        "math {} vs auto {}",
        e_math.peak_allocated,
        e_auto.peak_allocated
    );
}
