//! `.smelt` version 3, symbolic dimensions: the text form, the verifier's messages, binding
//! from inputs, and graphs with symbols run at many sizes against the same graph written
//! with those sizes.

mod common;

use common::{Tol, assert_close, inputs_for, smelt_in, stderr, stdout, temp_dir};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use smelt::exec::{CompileOptions, SymbolicFn};
use smelt::ir::parse_module;
use smelt::ir::sym::{Bindings, DimExpr};
use smelt::ir::text::SymbolicModule;
use smelt::runtime::{interp, npy};
use smelt::{DType, Device, Tensor};

fn parse(text: &str) -> SymbolicModule {
    SymbolicModule::parse(text, "t.smelt").unwrap()
}

fn parse_err(text: &str) -> String {
    SymbolicModule::parse(text, "t.smelt")
        .unwrap_err()
        .to_string()
}

fn shape_of(m: &smelt::ir::Module, i: usize) -> Vec<usize> {
    let g = m.entry();
    g.node(g.outputs()[i]).ty.shape.clone()
}

const ENC: &str = "graph enc(%ids: i64[B, S], %w: f32[1000, 128], %x: f32[B, S, 128]) {
  %h = view(%x, shape=[B*S, 128])
  %d = narrow(%x, dim=1, start=0, length=S-1)
  %e = embedding(%ids, %w)
  %s: f32[B, S, 128] = add(%e, %x)
  return %h, %d, %s
}
";

#[test]
fn the_issue_example_binds_and_reads_at_every_size() {
    let m = parse(ENC);
    assert_eq!(m.symbols(), ["B", "S"]);
    for (b, s) in [(1, 1), (2, 7), (3, 64)] {
        let sizes = m
            .bind(
                None,
                &[
                    ("ids", &[b, s][..]),
                    ("w", &[1000, 128][..]),
                    ("x", &[b, s, 128][..]),
                ],
            )
            .unwrap();
        assert_eq!(
            sizes,
            Bindings::from([("B".into(), b as i64), ("S".into(), s as i64)])
        );
        let g = m.instantiate(&sizes).unwrap();
        assert_eq!(shape_of(&g, 0), vec![b * s, 128]);
        assert_eq!(shape_of(&g, 1), vec![b, s - 1, 128]);
        assert_eq!(shape_of(&g, 2), vec![b, s, 128]);
    }
}

#[test]
fn the_verifier_names_dims_that_may_differ() {
    let e =
        parse_err("graph f(%x: f32[B, S], %y: f32[B, T]) {\n  %z = mul(%x, %y)\n  return %z\n}\n");
    assert_eq!(
        e,
        "t.smelt:2:8: mul: dims S and T may differ: f32[B, S] vs f32[B, T]"
    );
    // broadcasting against 1 written as such is fine; against a symbol it is not
    parse("graph f(%x: f32[B, S], %y: f32[1, S]) {\n  %z = mul(%x, %y)\n  return %z\n}\n");
    let e = parse_err(
        "graph f(%x: f32[B, S], %y: f32[S]) {\n  %t = transpose(%x, dim0=0, dim1=1)\n  %z = sub(%t, %y)\n  return %z\n}\n",
    );
    assert!(
        e.contains("sub: dims B and S may differ: f32[S, B] vs f32[S]"),
        "{e}"
    );
}

#[test]
fn a_relation_that_holds_by_chance_at_one_size_is_refused() {
    // at the first sample sizes B + 2 == S (101 + 2 = 103); the second round catches it
    let e = parse_err(
        "graph f(%x: f32[B], %two: f32[2], %y: f32[S]) {\n  %c = cat(%x, %two)\n  %z = add(%c, %y)\n  return %z\n}\n",
    );
    assert!(e.starts_with("t.smelt:3:8: add: dims"), "{e}");
    // a relation that holds for every size is accepted
    let m = parse(
        "graph f(%x: f32[B, S], %y: f32[S, B]) {\n  %a = view(%x, shape=[S*B])\n  %b = view(%y, shape=[B*S])\n  %z = add(%a, %b)\n  return %z\n}\n",
    );
    assert_eq!(m.symbols(), ["B", "S"]);
}

#[test]
fn what_only_some_sizes_allow_is_refused() {
    let e = parse_err("graph f(%x: f32[B]) {\n  %z = view(%x, shape=[2, -1])\n  return %z\n}\n");
    assert!(
        e.starts_with("t.smelt:2:8: view: shape '[2, -1]' is invalid for input of size"),
        "{e}"
    );
    assert!(e.contains("must hold for every size"), "{e}");
    // ... while a size the graph spells out is fine
    parse("graph f(%x: f32[2*B]) {\n  %z = view(%x, shape=[2, -1])\n  return %z\n}\n");
}

#[test]
fn binding_errors_name_the_symbol_and_both_sizes() {
    let m = parse("graph f(%x: f32[B, S], %b: f32[B, S]) {\n  %z = mul(%x, %b)\n  return %z\n}\n");
    let e = m
        .bind(None, &[("x", &[2, 5][..]), ("b", &[2, 6][..])])
        .unwrap_err();
    assert_eq!(e.to_string(), "S is 5 from %x but 6 from %b");
    let m = parse(ENC);
    let e = m
        .bind(
            None,
            &[
                ("ids", &[2, 0][..]),
                ("w", &[1000, 128][..]),
                ("x", &[2, 0, 128][..]),
            ],
        )
        .and_then(|s| m.instantiate(&s))
        .unwrap_err();
    assert_eq!(e.to_string(), "t.smelt:3:42: length S-1 = -1 at S = 0");
}

#[test]
fn dims_written_as_expressions_are_solved_or_checked() {
    let m = parse(
        "graph f(%x: f32[S+1], %y: f32[2*S]) {\n  %a = narrow(%x, dim=0, start=1, length=S)\n  %b = view(%y, shape=[2, S])\n  %z = add(%b, %a)\n  return %z\n}\n",
    );
    let s = m.bind(None, &[("x", &[8][..]), ("y", &[14][..])]).unwrap();
    assert_eq!(s["S"], 7);
    let e = m
        .bind(None, &[("x", &[8][..]), ("y", &[12][..])])
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "%y: dim 0 is 2*S = 14 at S = 7, but the input's is 12"
    );
}

#[test]
fn a_symbol_no_input_sizes_is_an_error() {
    let m = parse(
        "graph f(%x: f32[B]) {\n  %z = full(size=[T], fill_value=1.0)\n  %y = sum(%x)\n  return %y, %z\n}\n",
    );
    let e = m.bind(None, &[("x", &[3][..])]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "symbol T of graph f has no size: no input given sizes it"
    );
}

#[test]
fn the_concrete_reader_points_to_the_symbolic_one() {
    let e = parse_module("graph f(%x: f32[B]) {\n  return %x\n}\n", "t.smelt").unwrap_err();
    assert!(
        e.to_string().starts_with("t.smelt:1:17: symbolic size B:"),
        "{e}"
    );
}

#[test]
fn expressions_parse_with_precedence_and_parentheses() {
    let m = parse(
        "graph f(%x: f32[B, 2*S]) {\n  %a = view(%x, shape=[(B*S)//3*3 + B*S - (B*S)//3*3, 2])\n  %b = narrow(%a, dim=0, start=0, length=B*S - S//2 - 1 + 1)\n  return %b\n}\n",
    );
    let s = m.bind(None, &[("x", &[3, 10][..])]).unwrap();
    let g = m.instantiate(&s).unwrap();
    assert_eq!(shape_of(&g, 0), vec![15 - 2, 2]);
    // a bad token in a dim names it
    let e = parse_err("graph f(%x: f32[B, *]) {\n  return %x\n}\n");
    assert_eq!(e, "t.smelt:1:20: expected a dimension size, found '*'");
    let e = parse_err("graph f(%x: f32[B+]) {\n  return %x\n}\n");
    assert_eq!(e, "t.smelt:1:19: expected a size or a symbol, found ']'");
}

#[test]
fn the_printed_text_names_sizes_by_their_symbols_and_reads_back() {
    let m = parse(ENC);
    let text = m.print(None).unwrap();
    assert!(
        text.contains("%h: f32[B*S,128] = view(%x, shape=[B*S, 128])"),
        "{text}"
    );
    assert!(
        text.contains("%d: f32[B,S-1,128] = narrow(%x, dim=1, start=0, length=S-1)"),
        "{text}"
    );
    let again = parse(&text);
    assert_eq!(again.print(None).unwrap(), text);
}

/// A statement, written with its dims spelled by the function it is given.
type Line = Box<dyn Fn(&dyn Fn(&DimExpr) -> String) -> String>;

/// A random graph over `B` and `S`, written once with symbols and once at given sizes.
struct RandomGraph {
    /// Statements, each a function of how a dim is written.
    lines: Vec<Line>,
    outputs: Vec<String>,
}

fn sym(s: &str) -> DimExpr {
    DimExpr::Sym(s.into())
}

fn random_graph(seed: u64) -> RandomGraph {
    use DimExpr as D;
    let mut rng = StdRng::seed_from_u64(seed);
    let (b, s) = (sym("B"), sym("S"));
    // values so far: name and shape
    let mut pool: Vec<(String, Vec<D>)> = vec![
        ("x".into(), vec![b.clone(), s.clone()]),
        ("y".into(), vec![s.clone()]),
        ("z".into(), vec![s.clone(), D::Int(4)]),
        ("u".into(), vec![b.clone(), D::Int(1)]),
    ];
    let mut lines: Vec<Line> = Vec::new();
    let two_s = D::Mul(Box::new(D::Int(2)), Box::new(s.clone()));
    let b_s = D::Mul(Box::new(b.clone()), Box::new(s.clone()));
    let s_1 = D::Sub(Box::new(s.clone()), Box::new(D::Int(1)));
    for i in 0..rng.random_range(3..9) {
        let (a, ashape) = pool[rng.random_range(0..pool.len())].clone();
        let name = format!("v{i}");
        let pick = rng.random_range(0..9);
        let (shape, line): (Vec<D>, Line) = match pick {
            0 | 1 => {
                let f = ["relu", "tanh", "neg", "sigmoid", "exp"][rng.random_range(0..5)];
                let n = name.clone();
                (ashape, Box::new(move |_| format!("%{n} = {f}(%{a})")))
            }
            2 | 3 => {
                // a partner of the same shape or one that broadcasts into it
                let partners: Vec<(String, Vec<D>)> = pool
                    .iter()
                    .filter(|(_, p)| {
                        p.len() <= ashape.len()
                            && p.iter()
                                .rev()
                                .zip(ashape.iter().rev())
                                .all(|(x, y)| x == y || *x == D::Int(1))
                    })
                    .cloned()
                    .collect();
                let (p, _) = partners[rng.random_range(0..partners.len())].clone();
                let f = ["add", "mul", "sub", "maximum"][rng.random_range(0..4)];
                let n = name.clone();
                (ashape, Box::new(move |_| format!("%{n} = {f}(%{a}, %{p})")))
            }
            4 if ashape.len() == 2 => {
                let mut out = ashape.clone();
                out[1] = D::Int(1);
                let n = name.clone();
                let f = ["sum", "amax", "mean"][rng.random_range(0..3)];
                (
                    out,
                    Box::new(move |_| format!("%{n} = {f}(%{a}, dim=[1], keepdim=true)")),
                )
            }
            5 if ashape.len() == 2 && ashape[1] == s => {
                let n = name.clone();
                (
                    vec![ashape[0].clone(), D::Int(4)],
                    Box::new(move |_| format!("%{n} = matmul(%{a}, %z)")),
                )
            }
            6 if ashape == [b.clone(), s.clone()] => {
                let n = name.clone();
                let bs = b_s.clone();
                (
                    vec![b_s.clone()],
                    Box::new(move |w| format!("%{n} = view(%{a}, shape=[{}])", w(&bs))),
                )
            }
            7 if ashape.last() == Some(&s) => {
                let n = name.clone();
                let len = s_1.clone();
                let dim = ashape.len() - 1;
                let a2 = a.clone();
                lines.push(Box::new(move |w| {
                    format!(
                        "%{n}.n = narrow(%{a}, dim={dim}, start=1, length={})",
                        w(&len)
                    )
                }));
                // and put the first element last: a rotation, of size S again
                let n2 = name.clone();
                (
                    ashape.clone(),
                    Box::new(move |_| {
                        format!(
                            "%{n2}.h = narrow(%{a2}, dim={dim}, start=0, length=1)\n  %{n2} = cat(%{n2}.n, %{n2}.h, dim={dim})"
                        )
                    }),
                )
            }
            8 if ashape.last() == Some(&s) => {
                let n = name.clone();
                let mut out = ashape.clone();
                let last = out.len() - 1;
                out[last] = two_s.clone();
                (
                    out,
                    Box::new(move |_| format!("%{n} = cat(%{a}, %{a}, dim={last})")),
                )
            }
            _ => {
                let n = name.clone();
                (
                    ashape,
                    Box::new(move |_| format!("%{n} = softmax(%{a}, dim=-1)")),
                )
            }
        };
        lines.push(line);
        pool.push((name, shape));
    }
    let k = pool.len();
    RandomGraph {
        lines,
        outputs: vec![pool[k - 1].0.clone(), pool[k / 2].0.clone()],
    }
}

impl RandomGraph {
    /// The text with dims written by `w`; input types through `w` too.
    fn text(&self, w: &dyn Fn(&DimExpr) -> String) -> String {
        let (b, s) = (sym("B"), sym("S"));
        let mut t = format!(
            "graph g(%x: f32[{b}, {s}], %y: f32[{s}], %z: f32[{s}, 4], %u: f32[{b}, 1]) {{\n",
            b = w(&b),
            s = w(&s)
        );
        for l in &self.lines {
            t.push_str("  ");
            t.push_str(&l(w));
            t.push('\n');
        }
        let outs: Vec<String> = self.outputs.iter().map(|o| format!("%{o}")).collect();
        t.push_str(&format!("  return {}\n}}\n", outs.join(", ")));
        t
    }
}

#[test]
fn random_graphs_with_symbols_match_the_graphs_written_at_each_size() {
    let sizes: [(i64, i64); 7] = [(1, 1), (2, 2), (7, 1), (1, 7), (2, 64), (64, 7), (3, 1000)];
    for seed in 0..12 {
        let rg = random_graph(seed);
        let symbolic = rg.text(&|d: &DimExpr| d.to_string());
        let m = SymbolicModule::parse(&symbolic, "g.smelt")
            .unwrap_or_else(|e| panic!("seed {seed}: {e}\n{symbolic}"));
        let f = SymbolicFn::new(m, None, Device::Cpu, &CompileOptions::default()).unwrap();
        for (b, s) in sizes {
            let env = Bindings::from([("B".into(), b), ("S".into(), s)]);
            let concrete = rg.text(&|d: &DimExpr| d.eval(&env).unwrap().to_string());
            let g = parse_module(&concrete, "g.smelt").unwrap();
            let g = g.entry();
            let inputs = inputs_for(g, seed);
            let want = interp::run_positional(g, &inputs).unwrap();
            let got = f.call(&inputs).unwrap();
            for (i, (x, y)) in got.iter().zip(&want).enumerate() {
                let what = format!("seed {seed}, B={b}, S={s}, output {i}\n{symbolic}");
                assert_close(x, y, Tol::rel(1e-4), &what);
            }
            // the same binding again reuses its compile
            f.call(&inputs).unwrap();
        }
        assert_eq!(
            f.compiles(),
            sizes.len(),
            "seed {seed}: one compile per binding"
        );
    }
}

#[test]
fn smelt_run_and_check_take_symbolic_graphs() {
    let dir = temp_dir("run");
    std::fs::write(
        dir.join("f.smelt"),
        "graph f(%x: f32[B, S], %w: f32[S, 3]) {\n  %m = matmul(%x, %w)\n  %r = relu(%m)\n  %t = narrow(%x, dim=1, start=1, length=S-1)\n  return %r, %t\n}\n",
    )
    .unwrap();
    let mut rng = StdRng::seed_from_u64(7);
    for (b, s) in [(1, 2), (5, 9)] {
        let x = Tensor::from_vec(
            (0..b * s).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
            &[b, s],
        )
        .unwrap();
        let w = Tensor::from_vec(
            (0..s * 3).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
            &[s, 3],
        )
        .unwrap();
        npy::write_npy(dir.join("x.npy"), &x).unwrap();
        npy::write_npy(dir.join("w.npy"), &w).unwrap();
        for backend in ["interp", "cpu"] {
            let o = smelt_in(
                &dir,
                &[
                    "run",
                    "f.smelt",
                    "--input",
                    "x=x.npy",
                    "--input",
                    "w=w.npy",
                    "--out",
                    "o",
                    "--backend",
                    backend,
                ],
            );
            assert!(o.status.success(), "{}", stderr(&o));
            let r = npy::read_npy(dir.join("o/out0.npy")).unwrap();
            let t = npy::read_npy(dir.join("o/out1.npy")).unwrap();
            // float64 reference
            let (xv, wv) = (x.to_f64_vec(), w.to_f64_vec());
            let mut want = vec![0.0f64; b * 3];
            for i in 0..b {
                for j in 0..3 {
                    let dot: f64 = (0..s).map(|k| xv[i * s + k] * wv[k * 3 + j]).sum();
                    want[i * 3 + j] = dot.max(0.0);
                }
            }
            assert_eq!(r.shape(), &[b, 3]);
            assert_close(&r.to_f64_vec(), &want, Tol::rel(1e-5), "relu(x @ w)");
            let tail: Vec<f64> = (0..b)
                .flat_map(|i| xv[i * s + 1..(i + 1) * s].to_vec())
                .collect();
            assert_eq!(t.shape(), &[b, s - 1]);
            assert_eq!(t.to_f64_vec(), tail);
        }
    }
    // inputs that disagree on S
    let w = Tensor::zeros(&[4, 3], DType::F32);
    npy::write_npy(dir.join("w.npy"), &w).unwrap();
    let o = smelt_in(
        &dir,
        &[
            "run", "f.smelt", "--input", "x=x.npy", "--input", "w=w.npy", "--out", "o",
        ],
    );
    assert!(!o.status.success());
    assert_eq!(stderr(&o).trim(), "error: S is 9 from %x but 4 from %w");
    // dot draws them with their symbols too; a command without inputs says what it needs
    let o = smelt_in(&dir, &["dot", "f.smelt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stdout(&o).contains("f32[B,S-1]"), "{}", stdout(&o));
    let o = smelt_in(
        &dir,
        &["compile", "f.smelt", "--target", "cpu", "--out", "aot"],
    );
    assert_eq!(
        stderr(&o).trim(),
        "error: symbol B of graph f has no size: no input is given to size it (commands without inputs, and ahead-of-time objects, need fixed sizes)"
    );
    // check prints the types with their symbols
    let o = smelt_in(&dir, &["check", "f.smelt"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        stdout(&o).contains("%t: f32[B,S-1] = narrow(%x, dim=1, start=1, length=S-1)"),
        "{}",
        stdout(&o)
    );
}

fn randn(shape: &[usize], seed: u64) -> Tensor {
    let mut rng = StdRng::seed_from_u64(seed);
    let n: usize = shape.iter().product();
    Tensor::from_vec(
        (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
        shape,
    )
    .unwrap()
}

#[test]
fn a_trace_with_dynamic_dims_runs_at_every_size() {
    use smelt::jit::{TraceOptions, trace_with};
    let w = randn(&[8, 8], 1);
    let b = randn(&[8], 2);
    // attention-like: scores over the sequence, a residual, a flattening view
    let f = |xs: &[Tensor]| -> smelt::Result<Vec<Tensor>> {
        let x = &xs[0];
        let h = x.matmul(&w)?.add(&b)?.relu()?;
        let scores = h
            .matmul(&h.transpose(1, 2)?)?
            .mul_scalar(0.125)?
            .softmax(-1)?;
        let y = scores.matmul(x)?.add(x)?;
        Ok(vec![y.reshape(&[-1i64, 8])?, y.sum_dim(&[1], false)?])
    };
    let opts = TraceOptions::new()
        .name("attn")
        .param("w", &w)
        .param("b", &b);
    let traced = trace_with(f, &[randn(&[2, 5, 8], 3)], opts)
        .unwrap()
        .dynamic(0, 0, "B")
        .dynamic(0, 1, "S");
    let m = traced.symbolic().unwrap();
    assert_eq!(m.symbols(), ["B", "S"]);
    let text = m.print(None).unwrap();
    assert!(text.contains("%x0: f32[B,S,8]"), "{text}");
    assert!(text.contains("f32[B,S,S]"), "{text}");
    assert!(text.contains("f32[B*S,8]"), "{text}");
    let compiled = traced
        .compile_symbolic(Device::Cpu, &CompileOptions::default())
        .unwrap();
    for (k, (bs, s)) in [(1, 1), (3, 7), (2, 64), (1, 300)].into_iter().enumerate() {
        let x = randn(&[bs, s, 8], 10 + k as u64);
        let want = f(std::slice::from_ref(&x)).unwrap();
        let got = compiled.call(&[x]).unwrap();
        for (g, w) in got.iter().zip(&want) {
            assert_close(g, w, Tol::rel(1e-4), &format!("B={bs}, S={s}"));
        }
    }
    assert_eq!(compiled.compiles(), 4);
}

#[test]
fn a_trace_whose_values_follow_the_sizes_is_refused() {
    // a scale computed from the size in Rust is a constant of each trace
    let f = |xs: &[Tensor]| -> smelt::Result<Vec<Tensor>> {
        let n = xs[0].shape()[0] as f64;
        Ok(vec![xs[0].mul_scalar(1.0 / n.sqrt())?])
    };
    let traced = smelt::jit::trace(f, &[randn(&[4], 1)])
        .unwrap()
        .dynamic(0, 0, "N");
    let e = traced.symbolic().unwrap_err().to_string();
    assert!(
        e.contains("differs between sizes in more than its sizes"),
        "{e}"
    );
    // no dim marked
    let traced = smelt::jit::trace(f, &[randn(&[4], 1)]).unwrap();
    assert!(traced.symbolic().is_err());
}

#[test]
fn the_gradient_of_a_symbolic_graph_holds_at_every_size() {
    let m = parse(
        "graph f(%x: f32[B, S], %w: f32[S, 3]) {\n  %m = matmul(%x, %w)\n  %t = tanh(%m)\n  %v = view(%x, shape=[B*S])\n  %q = mul(%v, %v)\n  %s = sum(%q)\n  return %t, %s\n}\n",
    );
    let grad = m
        .transform(None, |g| smelt::passes::autodiff::autodiff(g, &["x", "w"]))
        .unwrap();
    assert_eq!(grad.symbols(), ["B", "S"]);
    let f = SymbolicFn::new(grad.clone(), None, Device::Cpu, &CompileOptions::default()).unwrap();
    for (k, (b, s)) in [(1, 1), (2, 7), (5, 64)].into_iter().enumerate() {
        let x = randn(&[b, s], 20 + k as u64);
        let w = randn(&[s, 3], 30 + k as u64);
        // the gradient of the graph written at these sizes, on the interpreter
        let concrete = m
            .instantiate(&Bindings::from([
                ("B".into(), b as i64),
                ("S".into(), s as i64),
            ]))
            .unwrap();
        let g = smelt::passes::autodiff::autodiff(concrete.entry(), &["x", "w"]).unwrap();
        let want = interp::run_positional(&g, &[x.clone(), w.clone()]).unwrap();
        let got = f.call(&[x, w]).unwrap();
        assert_eq!(got.len(), 4);
        for (i, (a, e)) in got.iter().zip(&want).enumerate() {
            assert_close(a, e, Tol::rel(1e-5), &format!("B={b}, S={s}, output {i}"));
        }
    }
    // independently of the pass: d(sum x*x)/dx = 2x at every size
    let sq = parse("graph f(%x: f32[N]) {\n  %q = mul(%x, %x)\n  %s = sum(%q)\n  return %s\n}\n");
    let grad = sq
        .transform(None, |g| smelt::passes::autodiff::autodiff(g, &["x"]))
        .unwrap();
    let f = SymbolicFn::new(grad, None, Device::Cpu, &CompileOptions::default()).unwrap();
    for n in [1, 9, 1000] {
        let x = randn(&[n], n as u64);
        let got = f.call(std::slice::from_ref(&x)).unwrap();
        let twice: Vec<f64> = x.to_f64_vec().iter().map(|v| 2.0 * v).collect();
        assert_eq!(got[1].to_f64_vec(), twice, "N={n}");
    }
}

#[test]
fn hostile_sizes_are_errors_not_crashes() {
    // deep parentheses and long chains are bounded, never a deep recursion
    let deep = format!(
        "graph f(%x: f32[{}S{}]) {{\n  return %x\n}}\n",
        "(".repeat(100_000),
        ")".repeat(100_000)
    );
    assert!(parse_err(&deep).contains("a size of more than 64 terms"));
    let long = format!(
        "graph f(%x: f32[S{}]) {{\n  return %x\n}}\n",
        "+S".repeat(100_000)
    );
    assert!(parse_err(&long).contains("a size of more than 64 terms"));
    // many symbols
    let dims: Vec<String> = (0..100).map(|i| format!("S{i}")).collect();
    let many = format!(
        "graph f(%x: f32[{}]) {{\n  return %x\n}}\n",
        dims.join(", ")
    );
    assert!(
        parse_err(&many).contains("more than 64 symbols"),
        "{}",
        parse_err(&many)
    );
    // overflow and division by zero
    let e = parse_err(
        "graph f(%x: f32[S]) {\n  %y = view(%x, shape=[S*9223372036854775807])\n  return %y\n}\n",
    );
    assert!(e.contains("overflows"), "{e}");
    let e = parse_err("graph f(%x: f32[S]) {\n  %y = view(%x, shape=[S//0])\n  return %y\n}\n");
    assert!(e.contains("divides by zero"), "{e}");
    // an input size no expression can meet
    let m = parse("graph f(%x: f32[2*S]) {\n  return %x\n}\n");
    let e = m.bind(None, &[("x", &[7][..])]).unwrap_err();
    assert_eq!(
        e.to_string(),
        "%x: dim 0 is 2*S, and no size of S makes it 7"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]
    /// Symbolic text with a few characters replaced, inserted or deleted: the reader returns
    /// a module or an error, never panics; what it returns binds and reads at small sizes
    /// without panicking either.
    #[test]
    fn mutated_symbolic_text_never_panics(
        edits in proptest::collection::vec((0usize..400, 0usize..3, 0usize..24), 1..6)
    ) {
        let alphabet: Vec<char> = "BS(*)+-/0123456789,[]%=x ".chars().collect();
        let mut text: Vec<char> = ENC.chars().collect();
        for (pos, kind, c) in edits {
            let pos = pos % (text.len() + 1);
            let ch = alphabet[c % alphabet.len()];
            match kind {
                0 if pos < text.len() => text[pos] = ch,
                1 => text.insert(pos, ch),
                _ if pos < text.len() => {
                    text.remove(pos);
                }
                _ => {}
            }
        }
        let text: String = text.into_iter().collect();
        if let Ok(m) = SymbolicModule::parse(&text, "m.smelt") {
            let _ = m.print(None);
            let g = m.sample().entry();
            let shapes: Vec<(String, Vec<usize>)> = g
                .inputs()
                .iter()
                .map(|&v| (g.node(v).name.clone(), g.node(v).ty.shape.iter().map(|d| d % 5).collect()))
                .collect();
            let given: Vec<(&str, &[usize])> =
                shapes.iter().map(|(n, s)| (n.as_str(), s.as_slice())).collect();
            if let Ok(b) = m.bind(None, &given) {
                let _ = m.instantiate(&b);
            }
        }
    }
}
