//! `jit::cond`, `while_loop`, `fori_loop` and `scan`: the same closures eagerly and under a
//! trace, the traced graph holding one control op (not N copies of the body), captured
//! tensors as operands (not constants), and the compiled graph agreeing with eager results
//! on inputs other than the example ones.

use smelt::exec::{CompileOptions, CompiledFn};
use smelt::ir::graph::Graph;
use smelt::ir::{parse_module, print_graph};
use smelt::jit::{cond, fori_loop, scan, trace, while_loop};
use smelt::{DType, Result, Tensor};

fn t(data: &[f32], shape: &[usize]) -> Tensor {
    Tensor::from_slice(data, shape).unwrap()
}

fn close(a: &Tensor, b: &Tensor, tol: f64) {
    assert_eq!((a.dtype(), a.shape()), (b.dtype(), b.shape()));
    let (x, y) = (a.try_to_f64_vec().unwrap(), b.try_to_f64_vec().unwrap());
    assert_eq!(x.len(), y.len());
    for (x, y) in x.iter().zip(&y) {
        assert!(
            (x - y).abs() <= tol * (1.0 + y.abs()),
            "{x} vs {y}\n{a}\n{b}"
        );
    }
}

fn count_op(g: &Graph, name: &str) -> usize {
    g.topo_order()
        .into_iter()
        .filter(|&v| g.node(v).op().is_some_and(|o| o.name() == name))
        .count()
}

/// Runs `g` three ways on `inputs` (interpreter, fused, unfused) and checks each against
/// `want`; also checks that the graph's text parses back to an equal graph.
fn check_everywhere(g: &Graph, inputs: &[Tensor], want: &[Tensor]) {
    let text = print_graph(g);
    let back = parse_module(&text, "traced.smelt").unwrap();
    assert!(back.entry() == g, "{text}");
    let interp = smelt::jit::run_graph(g, inputs).unwrap();
    assert_eq!(interp.len(), want.len());
    for (a, b) in interp.iter().zip(want) {
        close(a, b, 1e-5);
    }
    for fuse in [true, false] {
        let f = CompiledFn::compile(g, &CompileOptions::default().fused(fuse)).unwrap();
        let out = f.call(inputs).unwrap();
        assert_eq!(out.len(), want.len());
        for (a, b) in out.iter().zip(want) {
            close(a, b, 1e-5);
        }
    }
}

/// x ← 0.9·x + 0.1·i·w, n times: the eager reference.
fn affine_steps(x: &Tensor, w: &Tensor, n: i64) -> Tensor {
    let mut x = x.clone();
    for i in 0..n {
        x = &(&x * 0.9) + &(&(w * 0.1) * i as f64);
    }
    x
}

#[test]
fn fori_loop_of_1000_steps_stays_one_op() -> Result<()> {
    let x = t(&[1.0, -2.0, 0.5], &[3]);
    let w = t(&[0.25, 0.5, -1.0], &[3]);
    let body = |i: &Tensor, c: &[Tensor], w: &Tensor| -> Result<Vec<Tensor>> {
        let fi = i.to_dtype(DType::F32)?;
        Ok(vec![&(&c[0] * 0.9) + &(&(w * 0.1) * &fi)])
    };
    let eager = fori_loop(0, 1000, std::slice::from_ref(&x), |i, c| body(i, c, &w))?;
    close(&eager[0], &affine_steps(&x, &w, 1000), 1e-5);
    let traced = trace(
        |xs: &[Tensor]| fori_loop(0, 1000, &[xs[0].clone()], |i, c| body(i, c, &xs[1])),
        &[x.clone(), w.clone()],
    )?;
    let g = traced.graph();
    assert_eq!(count_op(g, "fori_loop"), 1);
    // the body once, not a thousand times
    assert!(g.len() < 12, "{}", print_graph(g));
    // w is read inside the body: a capture (an operand), not a constant
    assert_eq!(count_op(g, "constant"), 0, "{}", print_graph(g));
    let x2 = t(&[0.0, 3.0, -1.0], &[3]);
    let w2 = t(&[1.0, 1.0, 2.0], &[3]);
    check_everywhere(
        g,
        &[x2.clone(), w2.clone()],
        &[affine_steps(&x2, &w2, 1000)],
    );
    Ok(())
}

#[test]
fn while_loop_trip_count_follows_the_data() -> Result<()> {
    // double x until its sum passes a limit; count the steps
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let limit = &xs[1];
        while_loop(
            &[xs[0].clone(), Tensor::scalar(0i64)],
            |c| c[0].sum()?.lt(limit),
            |c| Ok(vec![&c[0] * 2.0, &c[1] + 1i64]),
        )
    };
    let x = t(&[1.0, 2.0], &[2]);
    let lim = Tensor::scalar(100.0);
    let eager = f(&[x.clone(), lim.clone()])?;
    assert_eq!(eager[1].item::<i64>()?, 6);
    let traced = trace(f, &[x.clone(), lim.clone()])?;
    let g = traced.graph();
    assert_eq!(count_op(g, "while_loop"), 1);
    // other data, other trip counts
    for (x, lim, steps) in [
        ([0.5f32, 0.5], 1.5f32, 1i64),
        ([3.0, 4.0], 1000.0, 8),
        ([9.0, 9.0], 1.0, 0),
    ] {
        let xs = [t(&x, &[2]), Tensor::scalar(lim)];
        let want = f(&xs)?;
        assert_eq!(want[1].item::<i64>()?, steps);
        check_everywhere(g, &xs, &want);
    }
    Ok(())
}

#[test]
fn cond_takes_the_branch_of_the_call() -> Result<()> {
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let p = xs[0].sum()?.gt(&Tensor::scalar(0.0))?;
        let y = &xs[1];
        cond(
            &p,
            |o| Ok(vec![(&o[0] * y).exp()?]),
            |o| Ok(vec![&o[0] - 1.0]),
            &[xs[0].clone()],
        )
    };
    let a = t(&[1.0, 2.0], &[2]);
    let y = t(&[0.5, -0.5], &[2]);
    let traced = trace(f, &[a.clone(), y.clone()])?;
    let g = traced.graph();
    assert_eq!(count_op(g, "cond"), 1);
    for x in [[1.0f32, 2.0], [-3.0, 1.0]] {
        let xs = [t(&x, &[2]), y.clone()];
        check_everywhere(g, &xs, &f(&xs)?);
    }
    Ok(())
}

#[test]
fn scan_stacks_ys_forward_and_reversed() -> Result<()> {
    for reverse in [false, true] {
        let f = move |xs: &[Tensor]| -> Result<Vec<Tensor>> {
            let (c, ys) = scan(
                &[xs[0].clone()],
                &[xs[1].clone()],
                |c, x| {
                    let n = &(&c[0] * 0.5) + &x[0];
                    Ok((vec![n.clone()], vec![&n * &n]))
                },
                reverse,
            )?;
            Ok(vec![c[0].clone(), ys[0].clone()])
        };
        let c0 = t(&[1.0, -1.0], &[2]);
        let xs = Tensor::randn(&[5, 2], None)?;
        let traced = trace(f, &[c0.clone(), xs.clone()])?;
        let g = traced.graph();
        assert_eq!(count_op(g, "scan"), 1);
        // eager reference by hand
        let mut c = c0.clone();
        let mut ys = vec![None; 5];
        for step in 0..5 {
            let i = if reverse { 4 - step } else { step };
            c = &(&c * 0.5) + &xs.select(0, i as i64)?;
            ys[i] = Some(&c * &c);
        }
        let ys: Vec<Tensor> = ys.into_iter().map(Option::unwrap).collect();
        let want = [c, Tensor::stack(&ys.iter().collect::<Vec<_>>(), 0)?];
        check_everywhere(g, &[c0.clone(), xs.clone()], &want);
        let other = Tensor::randn(&[5, 2], None)?;
        check_everywhere(g, &[c0.clone(), other.clone()], &f(&[c0, other])?);
    }
    Ok(())
}

#[test]
fn nested_loops_capture_through_levels() -> Result<()> {
    // a fori_loop inside a scan body reads the outer input w: captured at both levels
    let f = |xs: &[Tensor]| -> Result<Vec<Tensor>> {
        let w = &xs[2];
        let (c, ys) = scan(
            &[xs[0].clone()],
            &[xs[1].clone()],
            |c, x| {
                let inner = fori_loop(0, 3, &[c[0].clone()], |_, d| {
                    Ok(vec![(&(&d[0] * w) + &x[0]).tanh()?])
                })?;
                Ok((inner.clone(), vec![&inner[0] * 2.0]))
            },
            false,
        )?;
        Ok(vec![c[0].clone(), ys[0].clone()])
    };
    let c0 = Tensor::randn(&[3], None)?;
    let xs = Tensor::randn(&[4, 3], None)?;
    let w = Tensor::randn(&[3], None)?;
    let traced = trace(f, &[c0.clone(), xs.clone(), w.clone()])?;
    let g = traced.graph();
    assert_eq!(count_op(g, "constant"), 0, "{}", print_graph(g));
    let w2 = Tensor::randn(&[3], None)?;
    let args = [c0, xs, w2];
    check_everywhere(g, &args, &f(&args)?);
    Ok(())
}

#[test]
fn a_carry_that_changes_shape_is_named() {
    let x = t(&[1.0, 2.0], &[2]);
    let grow = |_: &Tensor, c: &[Tensor]| -> Result<Vec<Tensor>> {
        Ok(vec![c[0].clone(), Tensor::cat(&[&c[1], &c[1]], 0)?])
    };
    let e = fori_loop(0, 2, &[x.clone(), x.clone()], grow).unwrap_err();
    assert!(
        e.to_string()
            .contains("carry 1 changes from f32[2] to f32[4]"),
        "{e}"
    );
    let traced = trace(
        |xs: &[Tensor]| fori_loop(0, 2, &[xs[0].clone(), xs[0].clone()], grow),
        &[x],
    );
    let e = traced.err().expect("a growing carry must not trace");
    assert!(
        e.to_string()
            .contains("carry 1 changes from f32[2] to f32[4]"),
        "{e}"
    );
}

#[test]
fn cond_branches_of_other_types_are_refused_when_traced() {
    let x = t(&[1.0, 2.0], &[2]);
    let r = trace(
        |xs: &[Tensor]| {
            let p = xs[0].sum()?.gt(&Tensor::scalar(0.0))?;
            cond(
                &p,
                |o| Ok(vec![o[0].clone()]),
                |o| Ok(vec![o[0].sum()?]),
                &[xs[0].clone()],
            )
        },
        &[x],
    );
    let e = r.err().expect("branches of other types");
    assert!(
        e.to_string().contains("branches return different types"),
        "{e}"
    );
}
