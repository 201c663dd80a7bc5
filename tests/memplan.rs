//! Memory planning: liveness and slot reuse on hand-built schedules with known live ranges,
//! the example models, and random fused graphs.

mod common;

use common::{Recipe, random_graph_from};
use proptest::prelude::*;
use smelt::ir::op::{BinaryOp, Op};
use smelt::ir::parse_module;
use smelt::kernel::{
    Buffer, BufferKind, Expr, IndexMap, Kernel, Schedule, Step, Store, Value, View,
};
use smelt::passes::memplan::{Interval, liveness};
use smelt::passes::pipeline::Pipeline;
use smelt::passes::{MemoryPlan, plan};
use smelt::{DType, Scalar};

/// A 1-d buffer of `n` elements of `dtype`.
fn buf(name: &str, dtype: DType, n: usize, kind: BufferKind) -> Buffer {
    Buffer {
        name: name.into(),
        dtype,
        shape: vec![n],
        kind,
        channels_last: false,
    }
}

/// A pointwise kernel over `[n]` that reads `reads` and stores their sum (or a constant) to
/// every buffer of `writes`; all buffers f32 of `n` elements.
fn kernel(n: usize, reads: &[usize], writes: &[usize]) -> Step {
    let map = IndexMap {
        strides: vec![1],
        offset: 0,
    };
    let mut values = vec![Value {
        expr: Expr::Const(Scalar::Float(1.0)),
        dtype: DType::F32,
    }];
    for &b in reads {
        values.push(Value {
            expr: Expr::Load {
                buffer: b,
                map: map.clone(),
            },
            dtype: DType::F32,
        });
        let last = values.len() - 1;
        values.push(Value {
            expr: Expr::Binary(BinaryOp::Add, last - 1, last),
            dtype: DType::F32,
        });
    }
    let value = values.len() - 1;
    Step::Kernel(Kernel {
        name: "k".into(),
        outer: vec![n],
        inner: vec![],
        values,
        passes: vec![],
        stores: writes
            .iter()
            .map(|&b| Store {
                buffer: b,
                map: map.clone(),
                value,
            })
            .collect(),
    })
}

fn view(b: usize, n: usize) -> View {
    View {
        buffer: b,
        shape: vec![n],
        strides: vec![1],
        offset: 0,
    }
}

fn schedule(buffers: Vec<Buffer>, steps: Vec<Step>, outputs: Vec<View>) -> Schedule {
    let inputs = buffers
        .iter()
        .enumerate()
        .filter(|(_, b)| matches!(b.kind, BufferKind::Input(_)))
        .map(|(i, _)| i)
        .collect();
    let s = Schedule {
        name: "hand".into(),
        buffers,
        inputs,
        outputs,
        steps,
    };
    s.validate().unwrap();
    s
}

fn temp(name: &str, n: usize) -> Buffer {
    buf(name, DType::F32, n, BufferKind::Temp)
}

fn checked(s: &Schedule) -> MemoryPlan {
    let p = plan(s);
    p.validate(s).unwrap_or_else(|e| panic!("{e}\n{s}\n{p:?}"));
    assert!(p.peak_planned <= p.peak_unplanned);
    p
}

#[test]
fn a_chain_needs_two_slots() {
    // x → t1 → t2 → t3 → t4 (output): t_i is live over steps [i-1, i]
    let n = 100;
    let s = schedule(
        vec![
            buf("x", DType::F32, n, BufferKind::Input(0)),
            temp("t1", n),
            temp("t2", n),
            temp("t3", n),
            temp("t4", n),
        ],
        vec![
            kernel(n, &[0], &[1]),
            kernel(n, &[1], &[2]),
            kernel(n, &[2], &[3]),
            kernel(n, &[3], &[4]),
        ],
        vec![view(4, n)],
    );
    let iv = |first, last| Some(Interval { first, last });
    assert_eq!(
        liveness(&s),
        vec![None, iv(0, 1), iv(1, 2), iv(2, 3), iv(3, 3)]
    );
    let p = checked(&s);
    assert_eq!(p.slot_of[0], None);
    assert_eq!(p.slots(), 2);
    assert_eq!(p.slot_of[1], p.slot_of[3]);
    assert_eq!(p.slot_of[2], p.slot_of[4]);
    assert_ne!(p.slot_of[1], p.slot_of[2]);
    assert_eq!(p.peak_unplanned, 4 * 400);
    assert_eq!(p.peak_planned, 2 * 400);
}

#[test]
fn outputs_live_to_the_end_and_constants_are_not_planned() {
    let n = 7;
    let lit = smelt::ir::op::Literal {
        dtype: DType::F32,
        shape: vec![n],
        bytes: std::sync::Arc::new(vec![0; 4 * n]),
    };
    let s = schedule(
        vec![
            buf("c", DType::F32, n, BufferKind::Constant(lit)),
            temp("out", n),
            temp("a", n),
            temp("b", n),
            temp("c2", n),
        ],
        vec![
            kernel(n, &[0], &[1]),
            kernel(n, &[0], &[2]),
            kernel(n, &[2], &[3]),
            kernel(n, &[3], &[4]),
        ],
        vec![view(1, n), view(4, n)],
    );
    let live = liveness(&s);
    assert_eq!(live[1], Some(Interval { first: 0, last: 3 }));
    let p = checked(&s);
    assert_eq!(p.slot_of[0], None);
    for b in 2..5 {
        assert_ne!(
            p.slot_of[1], p.slot_of[b],
            "the output's slot is never reused"
        );
    }
    // a [1,2], b [2,3], c2 [3,3]: c2 reuses a's slot
    assert_eq!(p.slot_of[2], p.slot_of[4]);
    assert_eq!(p.slots(), 3);
}

#[test]
fn reuse_is_best_fit_across_dtypes_and_grows_a_slot_when_none_fits() {
    // steps 0 and 1 write big (f64, 1000) and small (f32, 25); step 2 reads both and writes
    // r (u8, 64): both slots are still busy, so it gets a new one; step 3 writes h (i16, 40 =
    // 80 bytes): best fit is the small slot (100 bytes), not the big one; step 4 writes g
    // (f32, 2100 = 8400 bytes): nothing free fits, the big slot grows.
    let s = Schedule {
        name: "fit".into(),
        buffers: vec![
            buf("x", DType::F32, 25, BufferKind::Input(0)),
            buf("big", DType::F64, 1000, BufferKind::Temp),
            buf("small", DType::F32, 25, BufferKind::Temp),
            buf("r", DType::U8, 64, BufferKind::Temp),
            buf("h", DType::I16, 40, BufferKind::Temp),
            buf("g", DType::F32, 2100, BufferKind::Temp),
        ],
        inputs: vec![0],
        outputs: vec![view(3, 64), view(4, 40), view(5, 2100)],
        steps: vec![
            Step::Extern(smelt::kernel::ExternCall {
                op: Op::Contiguous,
                args: vec![view(0, 25)],
                out: 1,
            }),
            Step::Extern(smelt::kernel::ExternCall {
                op: Op::Contiguous,
                args: vec![view(0, 25)],
                out: 2,
            }),
            Step::Extern(smelt::kernel::ExternCall {
                op: Op::Binary(BinaryOp::Add),
                args: vec![view(1, 25), view(2, 25)],
                out: 3,
            }),
            Step::Extern(smelt::kernel::ExternCall {
                op: Op::Contiguous,
                args: vec![view(0, 25)],
                out: 4,
            }),
            Step::Extern(smelt::kernel::ExternCall {
                op: Op::Contiguous,
                args: vec![view(0, 25)],
                out: 5,
            }),
        ],
    };
    let p = checked(&s);
    assert_eq!(p.slot_of[4], p.slot_of[2], "h takes the small slot: {p:?}");
    assert_eq!(p.slot_of[5], p.slot_of[1], "g grows the big slot: {p:?}");
    let big = p.slot_of[1].unwrap();
    assert_eq!(p.slot_bytes[big], 8400);
    assert_eq!(p.slots(), 3);
    assert_eq!(p.peak_planned, 8400 + 100 + 64);
    assert_eq!(p.peak_unplanned, 8000 + 100 + 64 + 80 + 8400);
}

#[test]
fn a_buffer_freed_by_a_step_is_not_reused_by_that_step() {
    // t1 is last read by the step that writes t2: they overlap and need two slots
    let n = 5;
    let s = schedule(
        vec![
            buf("x", DType::F32, n, BufferKind::Input(0)),
            temp("t1", n),
            temp("t2", n),
        ],
        vec![kernel(n, &[0], &[1]), kernel(n, &[1], &[2])],
        vec![view(2, n)],
    );
    let p = checked(&s);
    assert_ne!(p.slot_of[1], p.slot_of[2]);
}

#[test]
fn empty_and_stepless_schedules_plan() {
    let s = schedule(
        vec![buf("x", DType::F32, 0, BufferKind::Input(0)), temp("t", 0)],
        vec![kernel(0, &[0], &[1])],
        vec![view(1, 0)],
    );
    let p = checked(&s);
    assert_eq!(p.peak_planned, 0);
    let s = schedule(
        vec![buf("x", DType::F32, 3, BufferKind::Input(0))],
        vec![],
        vec![view(0, 3)],
    );
    let p = checked(&s);
    assert_eq!(p.slots(), 0);
}

#[test]
fn validate_refuses_bad_plans() {
    let n = 10;
    let s = schedule(
        vec![
            buf("x", DType::F32, n, BufferKind::Input(0)),
            temp("t1", n),
            temp("t2", n),
        ],
        vec![kernel(n, &[0], &[1]), kernel(n, &[1], &[2])],
        vec![view(2, n)],
    );
    let good = plan(&s);
    good.validate(&s).unwrap();
    let mut shared = good.clone();
    shared.slot_of[2] = shared.slot_of[1];
    let e = shared.validate(&s).unwrap_err().to_string();
    assert!(e.contains("live together"), "{e}");
    let mut small = good.clone();
    small.slot_bytes[0] = 39;
    small.peak_planned -= 1;
    assert!(small.validate(&s).unwrap_err().to_string().contains("fit"));
    let mut missing = good.clone();
    missing.slot_of[1] = None;
    assert!(missing.validate(&s).is_err());
    let mut input = good.clone();
    input.slot_of[0] = Some(0);
    assert!(input.validate(&s).is_err());
    let mut totals = good;
    totals.peak_unplanned += 1;
    assert!(totals.validate(&s).is_err());
}

#[test]
fn example_models_plan_within_their_temporaries() {
    for entry in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/models")).unwrap()
    {
        let path = entry.unwrap().path();
        let text = std::fs::read_to_string(&path).unwrap();
        let m = parse_module(&text, &path.display().to_string()).unwrap();
        for g in &m.graphs {
            let c = Pipeline::default().run(g).unwrap();
            checked(&c.schedule);
            assert_eq!(c.plan, plan(&c.schedule));
        }
    }
}

// ---- random fused graphs ------------------------------------------------------------------

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]
    #[test]
    fn plans_of_random_fused_graphs_are_valid(seed in any::<u64>(), n in 1usize..16) {
        let g = random_graph_from(&Recipe::MEMPLAN, seed, n);
        let c = Pipeline::default().run(&g).unwrap();
        let p = checked(&c.schedule);
        // every temporary is in a slot that is at least its size
        for (b, buf) in c.schedule.buffers.iter().enumerate() {
            let planned = p.slot_of[b].is_some();
            prop_assert_eq!(planned, buf.kind == BufferKind::Temp);
        }
    }
}

// ---- step order ---------------------------------------------------------------------------

#[test]
fn a_small_last_reader_moves_up_and_shortens_a_life() {
    use smelt::passes::memplan::hoist_last_readers;
    // in -> a -> b -> c (outputs c), and s = f(a) read last at the end: s moves up
    let buffers = vec![
        buf("in", DType::F32, 100, BufferKind::Input(0)),
        temp("a", 100),
        temp("b", 100),
        temp("c", 100),
        temp("s", 1),
    ];
    // a one-element result of `a` (a reduction's size)
    let small = kernel(1, &[1], &[4]);
    let steps = vec![
        kernel(100, &[0], &[1]),
        kernel(100, &[1], &[2]),
        kernel(100, &[2], &[3]),
        small,
    ];
    let s = schedule(buffers, steps, vec![view(3, 100), view(4, 1)]);
    let before = checked(&s);
    let mut h = s.clone();
    hoist_last_readers(&mut h);
    h.validate().unwrap();
    let writes = |s: &Schedule| -> Vec<usize> {
        s.steps
            .iter()
            .map(|st| match st {
                Step::Kernel(k) => k.stores[0].buffer,
                _ => usize::MAX,
            })
            .collect()
    };
    assert_eq!(writes(&s), [1, 2, 3, 4]);
    assert_eq!(writes(&h), [1, 4, 2, 3], "{h}");
    let after = checked(&h);
    assert!(
        after.peak_planned < before.peak_planned,
        "{} -> {}",
        before.peak_planned,
        after.peak_planned
    );
    // a chain that frees nothing stays as it is
    let mut again = h.clone();
    hoist_last_readers(&mut again);
    assert_eq!(writes(&again), writes(&h));
}

#[test]
fn a_training_step_holds_less_and_computes_the_same_bits() {
    use smelt::exec::{CompileOptions, CompiledFn};
    use smelt::passes::autodiff::autodiff;
    let text = "graph mlp(%x: f32[64,32], %y: f32[64,8], %w1: f32[48,32], %w2: f32[48,48], %w3: f32[8,48]) {
  %z1 = linear(%x, %w1)
  %h1 = relu(%z1)
  %z2 = linear(%h1, %w2)
  %h2 = tanh(%z2)
  %o = linear(%h2, %w3)
  %d = sub(%o, %y)
  %s = mul(%d, %d)
  %l = mean(%s)
  return %l
}";
    let m = parse_module(text, "mlp").unwrap();
    let g = autodiff(&m.graphs[0], &["w1", "w2", "w3"]).unwrap();
    let unordered = Pipeline::default()
        .run_until(&g, "fuse")
        .unwrap()
        .schedule
        .unwrap();
    let opts = CompileOptions::default();
    let plain = CompiledFn::from_schedule(unordered, vec![], &opts).unwrap();
    let ordered = CompiledFn::compile(&g, &opts).unwrap();
    let (held, held_before) = (
        ordered.temp_plan().slot_bytes(),
        plain.temp_plan().slot_bytes(),
    );
    assert!(held < held_before, "{held_before} -> {held} bytes");
    let mut rng = smelt::Generator::new(3);
    let args: Vec<smelt::Tensor> = [[64, 32], [64, 8], [48, 32], [48, 48], [8, 48]]
        .iter()
        .map(|s| smelt::Tensor::randn_with(s, Some(DType::F32), &mut rng).unwrap())
        .collect();
    let (a, b) = (plain.call(&args).unwrap(), ordered.call(&args).unwrap());
    assert_eq!((a.len(), b.len()), (4, 4));
    for (x, y) in a.iter().zip(&b) {
        common::assert_bits(x, y, "the same kernels in another order");
    }
}

/// Compiles `text`'s graph and returns it with its function.
fn compiled(text: &str) -> (smelt::ir::graph::Graph, smelt::exec::CompiledFn) {
    let g = parse_module(text, "t").unwrap().graphs.remove(0);
    let f = smelt::exec::CompiledFn::compile(&g, &smelt::exec::CompileOptions::default()).unwrap();
    (g, f)
}

/// The buffer of the schedule named after value `name` (or a part of its decomposition).
fn buffer_of(f: &smelt::exec::CompiledFn, name: &str) -> usize {
    f.schedule()
        .buffers
        .iter()
        .position(|b| b.name == name || b.name.starts_with(&format!("{name}.")))
        .unwrap_or_else(|| panic!("no buffer {name} in {}", f.schedule()))
}

#[test]
fn a_pointwise_result_is_written_over_its_dying_operand() {
    // h dies where g is made from it element by element: g takes h's slot and storage
    let text = "graph t(%x: f32[64,96], %w: f32[96,96], %y: f32[64,96]) {
  %h = matmul(%x, %w)
  %e = exp(%y)
  %g = mul(%h, %e)
  %k = matmul(%g, %w)
  return %k
}";
    let (g, f) = compiled(text);
    let p = f.temp_plan();
    let (h, gb) = (buffer_of(&f, "h"), buffer_of(&f, "g"));
    assert_eq!(p.written_over[gb], Some(h), "{}", f.schedule());
    assert_eq!(p.slot_of[gb], p.slot_of[h]);
    let mut rng = smelt::Generator::new(9);
    let args: Vec<smelt::Tensor> = [[64, 96], [96, 96], [64, 96]]
        .iter()
        .map(|s| smelt::Tensor::randn_with(s, Some(DType::F32), &mut rng).unwrap())
        .collect();
    let want = smelt::runtime::interp::run_positional(&g, &args).unwrap();
    // three calls: the later ones allocate nothing (each hands h's kept storage over to g,
    // and the previous output is dropped)
    for i in 0..3 {
        let before = smelt::runtime::storage::allocation_count();
        let got = f.call(&args).unwrap();
        if i > 0 {
            assert_eq!(smelt::runtime::storage::allocation_count() - before, 0);
        }
        let tol = common::Tol::allclose(1e-4, 1e-4);
        common::assert_close(&got[0], &want[0], tol, "reused buffers");
    }
}

#[test]
fn results_that_read_other_elements_or_live_operands_get_their_own_slot() {
    for (why, body) in [
        // reads h transposed: element (i, j) needs h's (j, i), which may be overwritten
        (
            "transposed read",
            "%t = transpose(%h, dim0=0, dim1=1)\n  %g = mul(%h, %t)",
        ),
        // h is read again by a later step
        (
            "operand still live",
            "%g = mul(%h, %h)\n  %q = matmul(%h, %x)",
        ),
        // a reduction over rows
        ("row reduction", "%g = softmax(%h, dim=1)"),
    ] {
        let extra = if why == "operand still live" {
            ", %q"
        } else {
            ""
        };
        let text = format!(
            "graph t(%x: f32[64,64], %w: f32[64,64]) {{
  %h = matmul(%x, %w)
  {body}
  %k = matmul(%g, %w)
  return %k{extra}
}}"
        );
        let (g, f) = compiled(&text);
        let gb = buffer_of(&f, "g");
        assert_eq!(
            f.temp_plan().written_over[gb],
            None,
            "{why}: {}",
            f.schedule()
        );
        let mut rng = smelt::Generator::new(10);
        let args: Vec<smelt::Tensor> = [[64, 64], [64, 64]]
            .iter()
            .map(|s| smelt::Tensor::randn_with(s, Some(DType::F32), &mut rng).unwrap())
            .collect();
        let want = smelt::runtime::interp::run_positional(&g, &args).unwrap();
        let got = f.call(&args).unwrap();
        assert_eq!(got.len(), want.len(), "{why}: outputs");
        for (a, b) in got.iter().zip(&want) {
            common::assert_close(a, b, common::Tol::allclose(1e-3, 1e-3), why);
        }
    }
}
