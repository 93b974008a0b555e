//! The attention backward kernels' workspaces in the dry run, held to what an NVIDIA H200
//! took inside each call.

use tch::Kind;

use super::{run_events, Call, BASE, SERIAL};
use crate::estimate::Attention;
use crate::events::EventKind;

/// The backward kernels' workspaces, against what an NVIDIA H200 took inside each call
/// (tests/data/gpu-truth/h200-2026-11-26/workspaces.csv, `transient`: the workspace
/// plus, for the memory-efficient kernel, its f32 [B, H, L] `delta`; for cuDNN, 512 B
/// the allocator rounds another block to): BERT-base (8 x 12 x 512 x 64, dropout),
/// GPT-2 (4 x 12 x 1024 x 64, causal) in f32 on the memory-efficient kernel and in bf16
/// on cuDNN, ViT-base (32 x 12 x 197 x 64) on both, SmolLM2 (4 x 9 x 1024 x 64) on cuDNN.
#[test]
fn attention_backward_workspaces_are_what_an_h200_took() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    // (kind, backend, B, H, L, dropout, causal, measured transient)
    let cases = [
        (
            Kind::Float,
            Attention::Efficient,
            8,
            12,
            512,
            0.1,
            false,
            12_976_128,
        ),
        (
            Kind::Float,
            Attention::Efficient,
            4,
            12,
            1024,
            0.1,
            true,
            12_976_128,
        ),
        (
            Kind::Float,
            Attention::Efficient,
            32,
            12,
            197,
            0.0,
            false,
            25_492_992,
        ),
        (
            Kind::BFloat16,
            Attention::Cudnn,
            8,
            12,
            512,
            0.1,
            false,
            12_780_032,
        ),
        (
            Kind::BFloat16,
            Attention::Cudnn,
            4,
            12,
            1024,
            0.1,
            true,
            12_780_032,
        ),
        (
            Kind::BFloat16,
            Attention::Cudnn,
            4,
            9,
            1024,
            0.0,
            true,
            9_585_152,
        ),
        (
            Kind::BFloat16,
            Attention::Cudnn,
            32,
            12,
            197,
            0.0,
            false,
            19_668_992,
        ),
    ];
    for (kind, backend, b, h, l, dropout, causal, measured) in cases {
        let c = Call {
            sm: 90,
            kind,
            b,
            h,
            hk: h,
            l,
            s: l,
            d: 64,
            dropout,
            causal,
            grad: true,
            ..BASE
        };
        let (events, _) = run_events(c, backend).unwrap();
        // The attention backward's: the op of the last transient (the loss's sum, before
        // backward, takes its own reduction buffers).
        let transients: Vec<&crate::events::Event> = events
            .iter()
            .filter(|e| matches!(e.kind, EventKind::Transient { .. }))
            .collect();
        let backward_op = transients.last().map(|e| e.op);
        let charged: Vec<i64> = transients
            .iter()
            .filter(|e| Some(e.op) == backward_op)
            .map(|e| e.value)
            .collect();
        let what = format!("{kind:?} {backend:?} {b}x{h}x{l}x64");
        let round64 = |x: i64| (x + 63) / 64 * 64;
        let (expected, took) = match backend {
            // f32 [B, H, L, D] and [B, H, L], L and D rounded up to 64; less delta.
            Attention::Efficient => (
                b * h * round64(l) * 64 * 4 + b * h * round64(l) * 4,
                measured - b * h * l * 4,
            ),
            // f32 [B, H, L, D] and [B, H, L]; less 512 B.
            _ => (b * h * l * 64 * 4 + b * h * l * 4, measured - 512),
        };
        assert_eq!(charged, vec![expected], "{what}");
        if l % 64 == 0 || backend == Attention::Cudnn {
            assert_eq!(expected, took, "{what}: to the byte");
        } else {
            let over = expected as f64 / took as f64 - 1.0;
            assert!((0.0..0.016).contains(&over), "{what}: {over}");
        }
    }
}
