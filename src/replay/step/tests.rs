//! Tests of the step replay: block categories, an incomplete profile, TorchScript module paths.

use super::*;

#[test]
fn torchscript_paths_find_back_the_containers_never_called() {
    let vars: Vec<VarEntry> = [
        "embeddings",
        "encoder.layer.0.attention.query",
        "encoder.layer.1.attention.query",
        "layer1.0.conv1",
        "heads.a.proj",
        "heads.b.proj",
    ]
    .iter()
    .map(|l| VarEntry {
        layer: l.to_string(),
        bytes: 4,
    })
    .collect();
    let m = module_paths(&vars);
    for (interpreter, named) in [
        (
            "encoder.0.attention.query",
            "encoder.layer.0.attention.query",
        ),
        ("encoder.1.attention", "encoder.layer.1.attention"),
        // Called modules, and modules without variables below a known one.
        ("layer1.0", "layer1.0"),
        ("layer1.0.relu", "layer1.0.relu"),
        ("embeddings", "embeddings"),
        // A ModuleDict's entry is found by its key.
        ("heads.b.proj", "heads.b.proj"),
        ("b.proj", "heads.b.proj"),
        // Nothing fits: the interpreter's name.
        ("decoder.0", "decoder.0"),
    ] {
        assert_eq!(module_path(interpreter, &m), named, "{interpreter}");
    }
}

fn alloc(ptr: u64, bytes: i64, generation: u32, phase: u8, op: i32) -> Event {
    Event {
        kind: EventKind::Alloc { stream: 0 },
        phase: crate::ffi::phase(phase),
        generation,
        op,
        ptr,
        value: bytes,
        ..Event::new(EventKind::Read)
    }
}
fn free(ptr: u64, bytes: i64, generation: u32, phase: u8, op: i32) -> Event {
    Event {
        kind: EventKind::Free,
        phase: crate::ffi::phase(phase),
        generation,
        op,
        ptr,
        value: -bytes,
        ..Event::new(EventKind::Read)
    }
}
fn begin(op: i32, phase: u8, var: i64) -> Event {
    Event {
        kind: EventKind::OpBegin,
        phase: crate::ffi::phase(phase),
        op,
        aux: -1,
        value: var,
        ..Event::new(EventKind::Read)
    }
}
fn end(op: i32, phase: u8, live: i64) -> Event {
    Event {
        kind: EventKind::OpEnd,
        phase: crate::ffi::phase(phase),
        op,
        aux: -1,
        value: live,
        ..Event::new(EventKind::Read)
    }
}
fn phase(generation: u32, p: u8) -> Event {
    Event {
        kind: EventKind::Phase,
        phase: crate::ffi::phase(p),
        generation,
        op: -1,
        ..Event::new(EventKind::Read)
    }
}

/// A hand-made iteration: weights 100 B at start, grads 10 B from the last
/// iteration (freed in forward), forward keeps 40 B and frees a 5 B temporary,
/// backward makes a 100 B gradient and a 7 B activation gradient, the optimizer
/// makes 200 B of state and a 3 B temporary.
#[test]
fn replay_classifies_blocks_by_what_became_of_them() {
    let start = StepStart {
        generation: 10,
        live: 100 + 10 + 1,
        param: [(1, 100)].into_iter().collect(),
        grad: [(2, 10)].into_iter().collect(),
        ..StepStart::default()
    };
    let events = vec![
        begin(0, 0, 0),
        alloc(10, 40, 10, 0, 0),
        alloc(11, 5, 10, 0, 0),
        free(11, 5, 10, 0, 0),
        free(2, 10, 5, 1, 0),
        end(0, 0, 141),
        phase(11, 1),
        begin(1, 1, -1),
        alloc(20, 100, 11, 1, 1),
        alloc(21, 7, 11, 1, 1),
        free(21, 7, 11, 1, 1),
        free(10, 40, 10, 0, 1),
        end(1, 1, 201),
        phase(12, 2),
        begin(2, 2, 0),
        alloc(30, 200, 12, 2, 2),
        alloc(31, 3, 12, 2, 2),
        free(31, 3, 12, 2, 2),
        end(2, 2, 401),
    ];
    let vars = vec![VarEntry {
        layer: "fc".into(),
        bytes: 100,
    }];
    let p = replay(
        &events,
        false,
        &start,
        0,
        &vars,
        &mut Names::default(),
        None,
    );
    assert!(p.complete);
    assert_eq!(p.rows.len(), 3);
    let r0 = &p.rows[0].bytes;
    assert_eq!(r0.get(Category::Param), 100);
    assert_eq!(r0.get(Category::Act), 40);
    assert_eq!(r0.get(Category::Grad), 0);
    assert_eq!(r0.get(Category::Other), 1);
    assert_eq!(r0.total(), 141);
    let r1 = &p.rows[1].bytes;
    assert_eq!(r1.get(Category::Grad), 100);
    assert_eq!(r1.get(Category::Act), 0);
    assert_eq!(r1.total(), 201);
    let r2 = &p.rows[2].bytes;
    assert_eq!(r2.get(Category::Opt), 200);
    assert_eq!(r2.total(), 401);
    // Peak: 100 + 100 + 1 + 200 + 3 during the optimizer op.
    assert_eq!(p.peak.bytes, 404);
    assert_eq!(p.peak.breakdown.get(Category::Temp), 3);
    assert_eq!(p.peak.op_index, Some(2));
    assert_eq!(p.peak.phase, Some(Phase::Optimizer));
    // Category maxima: TEMP saw 7 B in backward.
    assert_eq!(p.category_max.get(Category::Temp), 7);
    assert_eq!(p.category_max.get(Category::Act), 40);
    assert_eq!(p.category_max.get(Category::Grad), 100);
    // Layers: op 0 read variable 0 ("fc"); op 1 has no link and follows op 0.
    let fc = p.layers.iter().find(|l| l.layer == "fc").unwrap();
    assert_eq!(fc.activation_bytes, 40);
    assert_eq!(fc.parameters_bytes, 100);
    assert_eq!(p.phase_boundaries(), (Some(1), Some(2)));
}

#[test]
fn a_freed_block_of_unknown_birth_marks_the_profile_incomplete() {
    let start = StepStart {
        generation: 10,
        ..StepStart::default()
    };
    let events = vec![free(99, 8, 10, 0, -1)];
    let p = replay(&events, false, &start, 0, &[], &mut Names::default(), None);
    assert!(!p.complete);
}

fn read(op: i32, ptr: u64) -> Event {
    Event {
        kind: EventKind::Read,
        op,
        ptr,
        ..Event::new(EventKind::Read)
    }
}

/// Forward: op 0 makes A (100 B, site 1), op 1 reads A and makes M (4 B, never read).
/// Backward: op 2 makes C (200 B) and a gradient G (50 B, never read, outlives the step);
/// op 3 reads C and reaches the peak with D (300 B), then frees C and D; A is freed by op 4.
/// Peak 654 at D. Idle: A (last read op 1) and M (op 1 made it); G is a gradient, C is
/// read at the peak's own op.
#[test]
fn idle_blocks_are_those_whose_last_read_returned_before_the_peak() {
    let start = StepStart {
        generation: 10,
        ..StepStart::default()
    };
    let with_site = |mut e: Event, site: i32| {
        e.aux = site;
        e
    };
    let events = vec![
        begin(0, 0, -1),
        with_site(alloc(0xa, 100, 10, 0, 0), 1),
        end(0, 0, 100),
        begin(1, 0, -1),
        read(1, 0xa),
        with_site(alloc(0xb, 4, 10, 0, 1), 2),
        end(1, 0, 104),
        phase(11, 1),
        begin(2, 1, -1),
        alloc(0xc, 200, 11, 1, 2),
        alloc(0xd, 50, 11, 1, 2),
        end(2, 1, 354),
        begin(3, 1, -1),
        read(3, 0xc),
        alloc(0xe, 300, 11, 1, 3),
        free(0xe, 300, 11, 1, 3),
        free(0xc, 200, 11, 1, 3),
        end(3, 1, 154),
        begin(4, 1, -1),
        free(0xa, 100, 10, 0, 4),
        end(4, 1, 54),
    ];
    let mut names = Names::default();
    let mut site = |aux: i32| format!("site{aux}");
    let p = replay(&events, false, &start, 0, &[], &mut names, Some(&mut site));
    assert_eq!(p.peak.bytes, 654);
    let idle = p.idle.expect("detail on");
    assert_eq!(idle.peak, 654);
    assert_eq!(idle.bytes, 104);
    let sizes: Vec<u64> = idle.blocks.iter().map(|b| b.bytes).collect();
    assert_eq!(sizes, [100, 4]);
    let a = &idle.blocks[0];
    assert_eq!(a.site, "site1");
    assert_eq!(a.phase, Phase::Forward);
    // Without A from the end of op 1: 654 - 100 at D; M alone: 650; both: 550.
    assert_eq!(a.peak_if_dropped, 554);
    assert_eq!(idle.blocks[1].site, "site2");
    assert_eq!(idle.blocks[1].peak_if_dropped, 650);
    assert_eq!(idle.peak_if_dropped, 550);
    let sites: Vec<(&str, u64, usize, u64)> = idle
        .sites
        .iter()
        .map(|s| (s.site.as_str(), s.bytes, s.blocks, s.peak_if_dropped))
        .collect();
    assert_eq!(sites, [("site1", 100, 1, 554), ("site2", 4, 1, 650)]);
    assert_eq!(idle.peak_if_dropped_where(|b| b.site == "site1"), 554);
    assert_eq!(idle.peak_if_dropped_where(|_| true), 550);
    assert_eq!(idle.peak_if_dropped_where(|_| false), 654);
    // The band after each op: A (read last by op 1) and B (never read) from op 1's end;
    // A freed in op 4 leaves B.
    let band: Vec<u64> = p.rows.iter().map(|r| r.idle_bytes).collect();
    assert_eq!(band, [0, 104, 104, 104, 4]);
    // Without the detail there is no idle analysis.
    let p = replay(&events, false, &start, 0, &[], &mut Names::default(), None);
    assert!(p.idle.is_none());
    assert!(p.rows.iter().all(|r| r.idle_bytes == 0));
}

/// The peak moves: dropping a block that is idle at the first peak uncovers a second
/// moment almost as high, so the saving is less than the block.
#[test]
fn the_peak_if_dropped_is_found_again_and_may_move() {
    let start = StepStart {
        generation: 10,
        ..StepStart::default()
    };
    let events = vec![
        begin(0, 0, -1),
        alloc(0xa, 100, 10, 0, 0),
        end(0, 0, 100),
        // A second moment: 100 + 90, before A's last read.
        begin(1, 0, -1),
        read(1, 0xa),
        alloc(0xb, 90, 10, 0, 1),
        free(0xb, 90, 10, 0, 1),
        end(1, 0, 100),
        // The peak: 100 + 120, A idle.
        begin(2, 0, -1),
        alloc(0xc, 120, 10, 0, 2),
        free(0xc, 120, 10, 0, 2),
        end(2, 0, 100),
    ];
    let mut site = |_: i32| String::from("s");
    let p = replay(
        &events,
        false,
        &start,
        0,
        &[],
        &mut Names::default(),
        Some(&mut site),
    );
    let idle = p.idle.unwrap();
    assert_eq!(idle.peak, 220);
    assert_eq!(idle.blocks.len(), 1);
    assert_eq!(idle.blocks[0].peak_if_dropped, 190);
}
