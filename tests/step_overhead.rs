//! What compiled functions keep between calls: per-call scratch, reused temporary storages
//! and directly called GEMMs. Checked against the graph interpreter: concurrent calls, results
//! that later calls must not overwrite, strided and offset GEMM operands, and storage reuse
//! once the caller has dropped a result.

mod common;

use common::{Dist, assert_close, inputs_with, random_tensor};
use rand::SeedableRng;
use rand::rngs::StdRng;
use smelt::exec::{CompileOptions, CompiledFn, KernelBackend};
use smelt::ir::graph::Graph;
use smelt::ir::op::Op;
use smelt::ir::parse_module;
use smelt::jit::run_graph;
use smelt::nn::functional::{Reduction, mse_loss};
use smelt::nn::{Linear, Module};
use smelt::optim::{Optimizer, SGD, SGDConfig};
use smelt::runtime::storage::allocation_count;
use smelt::train::CompiledStep;
use smelt::{DType, Tensor};

fn graph(text: &str) -> Graph {
    let m = parse_module(text, "test").unwrap();
    m.graphs[0].clone()
}

/// Inputs of these tests: floats in [-2, 2) of every dtype.
const INPUTS: Dist = Dist {
    span: 2.0,
    ints: None,
    bools: None,
};

/// Both kernel backends, fused and not, on the global pool and on a pool of two threads.
fn configs() -> Vec<CompileOptions> {
    let mut v = Vec::new();
    for b in [KernelBackend::Cranelift, KernelBackend::Interp] {
        for fuse in [true, false] {
            v.push(CompileOptions::with_backend(b).fused(fuse));
            v.push(CompileOptions::with_backend(b).fused(fuse).threads(2));
        }
    }
    v
}

/// A small training-like graph: two GEMMs (one through a transposed view), pointwise
/// temporaries, a reduction and several outputs.
fn step_like(dtype: &str, m: usize, k: usize, n: usize) -> Graph {
    graph(&format!(
        "graph step(%x: {dtype}[{m},{k}], %w: {dtype}[{k},{n}], %y: {dtype}[{m},{n}]) {{
           %h = matmul(%x, %w)
           %d = sub(%h, %y)
           %d2 = square(%d)
           %l = mean(%d2)
           %g = mul(%d, 2.0)
           %xt = transpose(%x, dim0=0, dim1=1)
           %gw = matmul(%xt, %g)
           %st = mul(%gw, 0.1)
           %nw = sub(%w, %st)
           return %l, %nw, %h
         }}"
    ))
}

#[test]
fn concurrent_calls_match_the_interpreter() {
    // the last is large enough for its calls to move to a pool worker with the others
    // polling (`runtime::threads::hot`): four callers share the pool at once
    for (dtype, m, k, n) in [
        ("f32", 7, 3, 5),
        ("f64", 33, 1, 1),
        ("f32", 1, 1, 1),
        ("f32", 128, 64, 128),
    ] {
        let g = step_like(dtype, m, k, n);
        for opts in configs() {
            let f = CompiledFn::compile(&g, &opts).unwrap();
            std::thread::scope(|s| {
                for t in 0..4u64 {
                    let (f, g, opts) = (&f, &g, &opts);
                    s.spawn(move || {
                        for round in 0..20 {
                            let ins = inputs_with(g, 1000 * t + round, &INPUTS);
                            let want = run_graph(g, &ins).unwrap();
                            let got = f.call(&ins).unwrap();
                            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                                assert_close(a, b, 1e-5, &format!("{dtype} {opts:?} out {i}"));
                            }
                        }
                    });
                }
            });
        }
    }
}

#[test]
fn a_returned_result_never_changes_when_the_function_is_called_again() {
    let g = step_like("f32", 9, 4, 3);
    for opts in configs() {
        let f = CompiledFn::compile(&g, &opts).unwrap();
        let ins = inputs_with(&g, 1, &INPUTS);
        let first = f.call(&ins).unwrap();
        let kept: Vec<Vec<f64>> = first.iter().map(Tensor::to_f64_vec).collect();
        // later calls on other data, with their results dropped or held
        let mut held = Vec::new();
        for seed in 2..6 {
            let other = f.call(&inputs_with(&g, seed, &INPUTS)).unwrap();
            if seed % 2 == 1 {
                held.push(other);
            }
        }
        for (t, v) in first.iter().zip(&kept) {
            assert_eq!(&t.to_f64_vec(), v, "{opts:?}");
        }
        let want5 = run_graph(&g, &inputs_with(&g, 5, &INPUTS)).unwrap();
        for (a, b) in held[1].iter().zip(&want5) {
            assert_close(a, b, 1e-5, &format!("{opts:?} held"));
        }
        let want = run_graph(&g, &ins).unwrap();
        for (a, b) in first.iter().zip(&want) {
            assert_close(a, b, 1e-5, &format!("{opts:?}"));
        }
    }
}

#[test]
fn dropped_results_are_reused_and_held_ones_are_not() {
    let g = step_like("f32", 16, 3, 2);
    // the default options: the call runs on a pool worker, its storages count as ours
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let ins = inputs_with(&g, 3, &INPUTS);
    let want = run_graph(&g, &ins).unwrap();
    f.call(&ins).unwrap();
    let before = allocation_count();
    for _ in 0..5 {
        let got = f.call(&ins).unwrap();
        assert_close(&got[1], &want[1], 1e-5, "reused");
    }
    assert_eq!(
        allocation_count(),
        before,
        "calls whose results are dropped allocate no storage"
    );
    let held = f.call(&ins).unwrap();
    let before = allocation_count();
    let again = f.call(&ins).unwrap();
    assert!(allocation_count() > before, "held results get new storages");
    for (a, b) in held.iter().zip(&again) {
        assert!(!a.shares_storage(b));
        assert_eq!(a.to_f64_vec(), b.to_f64_vec());
    }
}

#[test]
fn gemm_operands_that_are_views_or_offset_inputs() {
    // transposed and sliced (step 2) operands, and a right operand of one column
    let g = graph(
        "graph g(%a: f64[8,7], %b: f64[5,8], %c: f32[6,4], %d: f32[4,1]) {
           %at = transpose(%a, dim0=0, dim1=1)
           %bt = transpose(%b, dim0=0, dim1=1)
           %p = matmul(%at, %bt)
           %cs = slice(%c, dim=0, start=0, end=6, step=2)
           %q = matmul(%cs, %d)
           return %p, %q
         }",
    );
    let mut rng = StdRng::seed_from_u64(7);
    // every input a contiguous view starting inside a larger storage
    let ins: Vec<Tensor> = g
        .inputs()
        .iter()
        .map(|&v| {
            let ty = &g.node(v).ty;
            let mut big = ty.shape.clone();
            big[0] += 3;
            let t = random_tensor(&mut rng, ty.dtype, &big, &INPUTS);
            let s = t.slice(0, Some(3), Some(big[0] as i64), 1).unwrap();
            assert!(s.is_contiguous() && s.storage_offset() > 0);
            s
        })
        .collect();
    let want = run_graph(&g, &ins).unwrap();
    for opts in configs() {
        let f = CompiledFn::compile(&g, &opts).unwrap();
        for _ in 0..3 {
            let got = f.call(&ins).unwrap();
            assert_close(&got[0], &want[0], 1e-12, &format!("{opts:?} p"));
            assert_close(&got[1], &want[1], 1e-5, &format!("{opts:?} q"));
        }
    }
}

#[test]
fn empty_and_zero_inner_size_products() {
    let g = graph(
        "graph g(%a: f32[0,3], %b: f32[3,2], %c: f32[4,0], %d: f32[0,5]) {
           %p = matmul(%a, %b)
           %q = matmul(%c, %d)
           %r = add(%q, 1.0)
           return %p, %r
         }",
    );
    let ins = inputs_with(&g, 0, &INPUTS);
    let want = run_graph(&g, &ins).unwrap();
    for opts in configs() {
        let f = CompiledFn::compile(&g, &opts).unwrap();
        for _ in 0..2 {
            let got = f.call(&ins).unwrap();
            assert_eq!(got[0].shape(), &[0, 2]);
            assert_close(&got[1], &want[1], 0.0, &format!("{opts:?}"));
            assert_eq!(got[1].to_f64_vec(), vec![1.0; 20]);
        }
    }
}

#[test]
fn wrong_inputs_are_still_refused() {
    let g = step_like("f32", 4, 2, 3);
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let mut ins = inputs_with(&g, 0, &INPUTS);
    ins[1] = Tensor::zeros(&[3, 2], DType::F32);
    let e = f.call(&ins).unwrap_err().to_string();
    assert!(e.contains("input 1 (w)") && e.contains("f32[2,3]"), "{e}");
    // a good call after a refused one still gives the interpreter's values
    let ins = inputs_with(&g, 1, &INPUTS);
    let want = run_graph(&g, &ins).unwrap();
    let got = f.call(&ins).unwrap();
    assert_close(&got[0], &want[0], 1e-5, "after error");
}

#[test]
fn losses_of_earlier_training_steps_keep_their_values() {
    let mut rng = StdRng::seed_from_u64(5);
    let x = random_tensor(&mut rng, DType::F32, &[100, 1], &INPUTS);
    let y = random_tensor(&mut rng, DType::F32, &[100, 1], &INPUTS);
    let m = Linear::new(1, 1, true).unwrap();
    let mut step = mse_sgd_step(&m, &x, &y, 0.1);
    let mut losses = Vec::new();
    for _ in 0..5 {
        // the loss of this step, from the eager forward on the current parameters
        let want = mse_loss(&m.forward(&x).unwrap(), &y, Reduction::Mean)
            .unwrap()
            .item_f64()
            .unwrap();
        let loss = step.step(&[x.clone(), y.clone()]).unwrap();
        assert!((loss.item_f64().unwrap() - want).abs() <= 1e-5 * want.abs().max(1.0));
        losses.push((loss, want));
    }
    for (i, (loss, want)) in losses.iter().enumerate() {
        let got = loss.item_f64().unwrap();
        assert!(
            (got - want).abs() <= 1e-5 * want.abs().max(1.0),
            "step {i}: {got} vs {want}"
        );
    }
    assert!(losses[4].1 < losses[0].1, "the loss goes down");
}

/// Copies of `ins` with storages of their own (the oracle's inputs, kept apart from what
/// `call_into` overwrites).
/// `m`'s MSE loss on (x, y) and its SGD update (learning rate `lr`) as one compiled step.
fn mse_sgd_step<'m>(m: &'m impl Module, x: &Tensor, y: &Tensor, lr: f64) -> CompiledStep<'m> {
    CompiledStep::new(
        |xs: &[Tensor]| mse_loss(&m.forward(&xs[0])?, &xs[1], Reduction::Mean),
        &[x.clone(), y.clone()],
        m.named_parameters(),
        SGDConfig::new(lr),
        &CompileOptions::default(),
    )
    .unwrap()
}

fn copies(ins: &[Tensor]) -> Vec<Tensor> {
    ins.iter()
        .map(|t| Tensor::from_vec(t.to_f64_vec(), t.shape()).unwrap())
        .zip(ins)
        .map(|(t, o)| smelt::runtime::apply(Op::To { dtype: o.dtype() }, &[&t]).unwrap())
        .collect()
}

#[test]
fn call_into_writes_an_update_into_the_parameter_it_reads() {
    for dtype in ["f32", "f64"] {
        let g = step_like(dtype, 7, 3, 5);
        for opts in configs() {
            let f = CompiledFn::compile(&g, &opts).unwrap();
            for seed in 0..3 {
                let ins = inputs_with(&g, seed, &INPUTS);
                let want = run_graph(&g, &copies(&ins)).unwrap();
                let w = ins[1].clone();
                let got = f.call_into(&ins, &[None, Some(&w), None]).unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_close(a, b, 1e-5, &format!("{dtype} {opts:?} out {i}"));
                }
                if got[1].shares_storage(&w) {
                    assert_close(&w, &want[1], 1e-5, "the parameter holds the update");
                } else {
                    assert_ne!(w.to_f64_vec(), want[1].to_f64_vec(), "{opts:?}");
                }
                // compiled kernels do it in place; the interpreter backend never does
                let native = opts.cpu.kernels == KernelBackend::Cranelift;
                assert_eq!(got[1].shares_storage(&w), native, "{dtype} {opts:?}");
                // fused and in place, the weight-gradient GEMM accumulates into w itself
                let fused = native && opts.fuses();
                assert_eq!(f.gemm_updates(), fused as usize, "{dtype} {opts:?}");
            }
        }
    }
}

#[test]
fn call_into_refuses_destinations_it_cannot_write_safely() {
    let g = step_like("f32", 6, 4, 3);
    let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
    let ins = inputs_with(&g, 9, &INPUTS);
    let want = run_graph(&g, &copies(&ins)).unwrap();
    let before: Vec<Vec<f64>> = ins.iter().map(Tensor::to_f64_vec).collect();
    let transposed = Tensor::zeros(&[3, 4], DType::F32).t().unwrap();
    let other_dtype = Tensor::zeros(&[4, 3], DType::F64);
    let fresh = Tensor::zeros(&[4, 3], DType::F32);
    let into_cases: Vec<Vec<Option<&Tensor>>> = vec![
        // an input the output's kernel does not read element by element
        vec![None, Some(&ins[0]), None],
        vec![None, None, Some(&ins[2])],
        vec![None, Some(&transposed), None],
        vec![None, Some(&other_dtype), None],
        // the same tensor for two outputs
        vec![None, Some(&fresh), Some(&fresh)],
    ];
    for into in &into_cases {
        let got = f.call_into(&ins, into).unwrap();
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert_close(a, b, 1e-5, &format!("out {i}"));
        }
        for (t, v) in ins.iter().zip(&before) {
            assert_eq!(&t.to_f64_vec(), v, "an input changed");
        }
        for d in into.iter().flatten() {
            assert!(got.iter().all(|o| !o.shares_storage(d)));
        }
    }
    assert_eq!(fresh.to_f64_vec(), vec![0.0; 12]);
    // a free tensor of the right type is written
    let got = f.call_into(&ins, &[None, Some(&fresh), None]).unwrap();
    assert!(got[1].shares_storage(&fresh));
    assert_close(&fresh, &want[1], 1e-5, "fresh destination");
}

#[test]
fn gemm_updates_only_where_the_update_is_theirs_alone() {
    // `d = xᵀ·g`, the weight gradient of w [6,5], followed by `tail`
    let after_gradient = |tail: &str| {
        format!(
            "graph g(%w: f32[6,5], %x: f32[7,6], %g: f32[7,5]) {{
               %xt = transpose(%x, dim0=0, dim1=1)
               %d = matmul(%xt, %g)
               {tail}
             }}"
        )
    };
    // (graph, GEMMs that may update w in place)
    let cases = [
        // w - 0.1·(xᵀ·g), and the same written as w + (-0.1)·(xᵀ·g) with the factor first
        (
            after_gradient("%s = mul(%d, 0.1)\n %n = sub(%w, %s)\n return %n"),
            1,
        ),
        (
            after_gradient("%s = mul(-0.1, %d)\n %n = add(%s, %w)\n return %n"),
            1,
        ),
        // w is an operand of the product: accumulating into it would change what it reads
        (
            "graph g(%w: f32[5,5], %x: f32[5,5], %g: f32[5,5]) {
               %d = matmul(%w, %x)
               %s = mul(%d, 0.1)
               %n = sub(%w, %s)
               return %n
             }"
            .to_string(),
            0,
        ),
        // the gradient is also returned
        (
            after_gradient("%s = mul(%d, 0.1)\n %n = sub(%w, %s)\n return %n, %d"),
            0,
        ),
        // not a scaled update
        (
            after_gradient("%s = mul(%d, %w)\n %n = sub(%w, %s)\n return %n"),
            0,
        ),
    ];
    for (text, updates) in &cases {
        let (text, updates) = (text.as_str(), *updates);
        let g = graph(text);
        let f = CompiledFn::compile(&g, &CompileOptions::default()).unwrap();
        assert_eq!(f.gemm_updates(), updates, "{}", f.schedule());
        for seed in 0..2 {
            let want = run_graph(&g, &inputs_with(&g, seed, &INPUTS)).unwrap();
            // out of place, into w itself, into a fresh tensor; each on new inputs
            for dest in 0..3 {
                let ins = inputs_with(&g, seed, &INPUTS);
                let w = ins[0].clone();
                let fresh = Tensor::zeros(w.shape(), DType::F32);
                let mut into = vec![[None, Some(&w), Some(&fresh)][dest]];
                into.resize(want.len(), None);
                let got = f.call_into(&ins, &into).unwrap();
                for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                    assert_close(a, b, 1e-5, &format!("{text} dest {dest} out {i}"));
                }
                if dest == 1 && updates == 1 {
                    assert!(got[0].shares_storage(&w));
                    assert_close(&w, &want[0], 1e-5, "w updated in place");
                }
            }
        }
    }
}

#[test]
fn call_into_matches_the_interpreter_when_the_parameter_is_read_again() {
    // the parameter is read again, at other elements or after its update: wherever the
    // executor writes, every result must still be the interpreter's
    let graphs = [
        "graph g(%w: f32[5,5], %x: f32[5,5]) {
           %a = add(%w, 1.0)
           %t = transpose(%w, dim0=0, dim1=1)
           %o = add(%a, %t)
           return %a, %o
         }",
        "graph g(%w: f32[4,4], %x: f32[4,4]) {
           %a = mul(%w, 0.5)
           %m = matmul(%a, %w)
           %s = sum(%w, dim=[1], keepdim=true)
           %o = add(%m, %s)
           return %a, %o
         }",
        "graph g(%w: f32[3,6], %x: f32[6,2]) {
           %m = matmul(%w, %x)
           %a = sub(%w, 0.25)
           %r = relu(%m)
           return %a, %r, %w
         }",
    ];
    for text in graphs {
        let g = graph(text);
        for opts in configs() {
            let f = CompiledFn::compile(&g, &opts).unwrap();
            let ins = inputs_with(&g, 4, &INPUTS);
            let want = run_graph(&g, &copies(&ins)).unwrap();
            let w = ins[0].clone();
            let got = f.call_into(&ins, &[Some(&w)]).unwrap();
            // a returned input is a view of the caller's tensor: compare the others
            for (i, (a, b)) in got.iter().zip(&want).enumerate().take(2) {
                assert_close(a, b, 1e-5, &format!("{opts:?} out {i}\n{}", f.schedule()));
            }
        }
    }
}

#[test]
fn compiled_step_updates_the_parameter_tensors_in_place() {
    let mut rng = StdRng::seed_from_u64(11);
    let x = random_tensor(&mut rng, DType::F32, &[20, 3], &INPUTS);
    let y = random_tensor(&mut rng, DType::F32, &[20, 2], &INPUTS);
    let (wv, bv) = (
        random_tensor(&mut rng, DType::F32, &[2, 3], &INPUTS),
        random_tensor(&mut rng, DType::F32, &[2], &INPUTS),
    );
    let layer = || {
        let w = copies(std::slice::from_ref(&wv)).remove(0);
        let b = copies(std::slice::from_ref(&bv)).remove(0);
        w.requires_grad_(true).unwrap();
        b.requires_grad_(true).unwrap();
        Linear::from_tensors(w, Some(b)).unwrap()
    };
    let (m, eager) = (layer(), layer());
    let addrs: Vec<usize> = m.parameters().iter().map(Tensor::data_ptr).collect();
    let mut step = mse_sgd_step(&m, &x, &y, 0.05);
    let mut opt = SGD::new(eager.parameters(), SGDConfig::new(0.05)).unwrap();
    for _ in 0..4 {
        let versions: Vec<u64> = m.parameters().iter().map(Tensor::version).collect();
        step.step(&[x.clone(), y.clone()]).unwrap();
        opt.zero_grad();
        mse_loss(&eager.forward(&x).unwrap(), &y, Reduction::Mean)
            .unwrap()
            .backward()
            .unwrap();
        opt.step().unwrap();
        for ((p, q), v) in m.parameters().iter().zip(eager.parameters()).zip(versions) {
            assert_close(p, &q, 1e-5, "parameter after the step");
            assert!(p.version() > v, "the update counts as an in-place write");
        }
    }
    let after: Vec<usize> = m.parameters().iter().map(Tensor::data_ptr).collect();
    assert_eq!(addrs, after);
}

#[test]
fn an_mlp_step_graph_updates_its_weights_in_place() {
    let mut rng = StdRng::seed_from_u64(12);
    let x = random_tensor(&mut rng, DType::F32, &[8, 160], &INPUTS);
    let y = random_tensor(&mut rng, DType::F32, &[8, 7], &INPUTS);
    let m = smelt::nn::Sequential::new()
        .add(Linear::new(160, 200, true).unwrap())
        .add(smelt::nn::ReLU::new())
        .add(Linear::new(200, 7, true).unwrap());
    let step = mse_sgd_step(&m, &x, &y, 0.1);
    // both weight updates are done by their gradient's GEMM
    assert_eq!(step.compiled().gemm_updates(), 2);
    let params = m.parameters();
    let copied: Vec<Tensor> = copies(&params);
    let mut args = vec![x.clone(), y.clone()];
    args.extend(params.iter().cloned());
    let mut oracle_args = vec![x.clone(), y.clone()];
    oracle_args.extend(copied);
    let want = run_graph(step.graph(), &oracle_args).unwrap();
    let mut into: Vec<Option<&Tensor>> = vec![None];
    into.extend(params.iter().map(Some));
    let got = step.compiled().call_into(&args, &into).unwrap();
    for (i, p) in params.iter().enumerate() {
        // the weights' updates are pointwise kernels; a bias update fuses into the
        // reduction of its gradient, which stays out of place (and is copied back)
        if p.dim() == 2 {
            assert!(got[1 + i].shares_storage(p), "weight {i} updated in place");
            assert_close(p, &want[1 + i], 1e-5, &format!("parameter {i}"));
        }
        assert_close(&got[1 + i], &want[1 + i], 1e-5, &format!("parameter {i}"));
    }
    assert_close(&got[0], &want[0], 1e-5, "loss");
}
