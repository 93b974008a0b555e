//! The meta-kernel inventory, taken from this process's dispatcher: every aten op that
//! has a CPU kernel but no composite kernel and no meta kernel in libtorch's C++, and
//! which of them the dry run registers its own for. Held against PyTorch: the wheel's
//! Python (which adds its meta registrations and decompositions from Python) says which
//! of these ops PyTorch runs on the meta device. The test prints the inventory's counts
//! and the ops PyTorch covers that the dry run does not yet
//! (`cargo test --test meta_inventory -- --nocapture`).

mod common;

use std::collections::BTreeSet;
use std::io::Write;
use std::process::{Command, Stdio};

use tch_memprof::estimate::trace::meta_kernel_inventory;

/// Reads op names (`aten::name.overload`) from stdin, one a line; prints those PyTorch
/// has a meta kernel for (C++ or registered from Python) once `torch` is imported.
const PYTORCH_META: &str = r#"
import sys, torch, torch._meta_registrations  # noqa: F401
for line in sys.stdin:
    name = line.strip()
    if name and torch._C._dispatch_has_kernel_for_dispatch_key(name, "Meta"):
        print(name)
"#;

/// Ops real models call that libtorch's C++ has no meta kernel for: the dry run must
/// register each (transformers, torchvision and timm models stop without them).
const MUST_BE_OURS: &[&str] = &[
    "aten::var.correction",
    "aten::roll",
    "aten::hardswish",
    "aten::hardtanh_backward",
    "aten::_weight_norm_interface",
    "aten::native_group_norm_backward",
    "aten::_native_multi_head_attention",
    "aten::native_batch_norm",
];

#[test]
fn the_inventory_of_ops_libtorch_cannot_run_on_meta() {
    let _serial = common::serial();
    let inventory = meta_kernel_inventory().unwrap();
    assert!(!inventory.is_empty());
    let ours: BTreeSet<&str> = inventory
        .iter()
        .filter(|(_, o)| *o)
        .map(|(n, _)| n.as_str())
        .collect();
    let missing: BTreeSet<&str> = inventory
        .iter()
        .filter(|(_, o)| !*o)
        .map(|(n, _)| n.as_str())
        .collect();
    for op in MUST_BE_OURS {
        assert!(ours.contains(op), "{op} is not registered by the dry run");
    }
    println!(
        "{} aten ops have a CPU kernel but no composite and no meta kernel in libtorch's \
         C++: the dry run registers {}, {} remain",
        inventory.len(),
        ours.len(),
        missing.len()
    );
    println!(
        "registered by the dry run: {}",
        ours.iter().copied().collect::<Vec<_>>().join(" ")
    );

    let Some(python) = common::torch_python() else {
        common::cannot_run(
            "the inventory against PyTorch's own meta coverage: no Python with torch beside \
             LIBTORCH (run through scripts/with-libtorch.sh)",
        );
        return;
    };
    let mut child = Command::new(python)
        .args(["-c", PYTORCH_META])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs python");
    {
        let mut stdin = child.stdin.take().unwrap();
        for (op, _) in &inventory {
            writeln!(stdin, "{op}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", common::text(&out.stderr));
    let text = common::text(&out.stdout);
    let pytorch: BTreeSet<&str> = text.lines().collect();
    let pytorch_not_ours: Vec<&str> = missing.intersection(&pytorch).copied().collect();
    println!(
        "PyTorch runs {} of them on meta (from Python); of those, the dry run registers {} \
         and lacks {}:",
        pytorch.len(),
        ours.intersection(&pytorch).count(),
        pytorch_not_ours.len()
    );
    for chunk in pytorch_not_ours.chunks(6) {
        println!("  {}", chunk.join(" "));
    }
    // The ops real models need, PyTorch runs on meta as well (its Python fills the same
    // gap): the inventory's gap is real, not an op that cannot run without data.
    for op in MUST_BE_OURS {
        assert!(pytorch.contains(op), "PyTorch does not run {op} on meta");
    }
}
