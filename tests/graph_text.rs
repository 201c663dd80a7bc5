//! The graph IR and its `.smelt` text form: parsing, printing, round trips, errors,
//! the verifier and Graphviz output.

use proptest::prelude::*;
use smelt::ir::attrs::{Attr, op_names};
use smelt::ir::dtype::Scalar;
use smelt::ir::graph::{Graph, GraphBuilder, NodeKind, ValueId};
use smelt::ir::op::{BinaryOp, Literal, Op, ReduceOp, TensorType, UnaryOp};
use smelt::ir::{Module, parse_module, print_graph, print_module};
use smelt::{DType, Error};
use std::sync::Arc;

const EXAMPLE: &str = r#"
# a fused MLP block
graph block(%x: f32[256,1024], %w: f32[4096,1024], %b: f32[4096]) {
  %h: f32[256,4096] = linear(%x, %w, %b)
  %a = relu(%h)
  %s = mul(%a, 0.5)
  %m = sum(%s, dim=[1], keepdim=true)
  return %s, %m
}
"#;

fn parse(text: &str) -> Module {
    match parse_module(text, "t.smelt") {
        Ok(m) => m,
        Err(e) => panic!("{e}\n{text}"),
    }
}

/// parse(print(m)) == m and printing is stable.
fn assert_round_trip(m: &Module) {
    let text = print_module(m);
    let again = parse(&text);
    assert_eq!(&again, m, "{text}");
    assert_eq!(print_module(&again), text);
}

/// The op of the statement defining `%name` in the entry graph.
fn op_of(m: &Module, name: &str) -> Op {
    let g = m.entry();
    let v = g.value(name).unwrap();
    g.node(v).op().unwrap().clone()
}

#[test]
fn spec_example_parses_with_the_right_graph() {
    let m = parse(EXAMPLE);
    let g = m.entry();
    assert_eq!(g.name, "block");
    assert_eq!(g.inputs().len(), 3);
    assert_eq!(g.outputs().len(), 2);
    let h = g.value("h").unwrap();
    assert_eq!(g.node(h).ty, TensorType::new(DType::F32, vec![256, 4096]));
    assert_eq!(
        g.operands(h),
        vec![
            g.value("x").unwrap(),
            g.value("w").unwrap(),
            g.value("b").unwrap()
        ]
    );
    assert_eq!(op_of(&m, "h"), Op::Linear { has_bias: true });
    let s = g.value("s").unwrap();
    let ops = g.operands(s);
    assert_eq!(ops[0], g.value("a").unwrap());
    assert_eq!(g.node(ops[1]).op(), Some(&Op::Scalar(Scalar::Float(0.5))));
    assert_eq!(
        op_of(&m, "m"),
        Op::Reduce {
            op: ReduceOp::Sum,
            dim: Some(vec![1]),
            keepdim: true
        }
    );
    assert_eq!(g.node(g.value("m").unwrap()).ty.shape, vec![256, 1]);
    assert_eq!(g.outputs(), &[s, g.value("m").unwrap()]);
    assert_round_trip(&m);
}

#[test]
fn printed_example_is_the_expected_text() {
    let text = print_module(&parse(EXAMPLE));
    let want = "graph block(%x: f32[256,1024], %w: f32[4096,1024], %b: f32[4096]) {
  %h: f32[256,4096] = linear(%x, %w, %b)
  %a: f32[256,4096] = relu(%h)
  %s: f32[256,4096] = mul(%a, 0.5)
  %m: f32[256,1] = sum(%s, dim=[1], keepdim=true)
  return %s, %m
}
";
    assert_eq!(text, want);
}

/// One statement per op (every name the format knows), each in a small graph.
const OP_STATEMENTS: &[&str] = &[
    "scalar(value=2.5)",
    "constant(dtype=f32, shape=[2], data=[1.5, -2.0])",
    "full(size=[2,3], fill_value=7)",
    "zeros(size=[2])",
    "ones(size=[1,2], dtype=i32)",
    "arange(start=1, end=10, step=3)",
    "arange(end=4.5)",
    "neg(%x)",
    "abs(%x)",
    "exp(%x)",
    "log(%x)",
    "log1p(%x)",
    "expm1(%x)",
    "sqrt(%x)",
    "rsqrt(%x)",
    "sin(%x)",
    "cos(%x)",
    "tanh(%x)",
    "sigmoid(%x)",
    "relu(%x)",
    "gelu(%x)",
    "gelu(%x, approximate=\"tanh\")",
    "gelu_slope(%x)",
    "gelu_slope(%x, approximate=\"tanh\")",
    "silu(%x)",
    "erf(%x)",
    "floor(%x)",
    "ceil(%x)",
    "round(%x)",
    "sign(%x)",
    "reciprocal(%x)",
    "square(%x)",
    "logical_not(%x)",
    "isnan(%x)",
    "leaky_relu(%x)",
    "leaky_relu(%x, negative_slope=0.2)",
    "elu(%x, alpha=1.5)",
    "softplus(%x)",
    "softplus(%x, beta=2, threshold=10.0)",
    "hardtanh(%x, min_val=-2.0, max_val=2.0)",
    "hardswish(%x)",
    "mish(%x)",
    "logsigmoid(%x)",
    "add(%x, %y)",
    "sub(%x, 1)",
    "mul(%x, -0.25)",
    "div(2, %x)",
    "pow(%x, 2.0)",
    "maximum(%x, %y)",
    "minimum(%x, %y)",
    "remainder(%x, 3)",
    "div(%x, %y, rounding_mode=\"floor\")",
    "div(%x, 2, rounding_mode=\"trunc\")",
    "eq(%x, %y)",
    "ne(%x, 0)",
    "lt(%x, inf)",
    "le(%x, -inf)",
    "gt(%x, 1e-3)",
    "ge(%x, %y)",
    "logical_and(%x, true)",
    "logical_or(%x, false)",
    "where(%m, %x, 0.0)",
    "clamp(%x, min=0.0)",
    "clamp(%x, min=-1, max=1)",
    "to(%x, dtype=f16)",
    "masked_fill(%x, %m, value=-1.5)",
    "sum(%x)",
    "sum(%x, dim=1, keepdim=true)",
    "mean(%x, dim=[0, 1])",
    "prod(%x, dim=1)",
    "amax(%x, dim=-1)",
    "amin(%x)",
    "all(%x)",
    "any(%x, dim=0)",
    "logsumexp(%x, dim=1)",
    "argmax(%x)",
    "argmin(%x, dim=1, keepdim=true)",
    "var(%x)",
    "std(%x, dim=1, correction=0)",
    "cumsum(%x, dim=1)",
    "softmax(%x, dim=-1)",
    "log_softmax(%x, dim=0)",
    "layer_norm(%x, none, none, normalized_shape=[3])",
    "layer_norm(%x, %v, none, normalized_shape=[3], eps=0.001)",
    "layer_norm(%x, none, %v, normalized_shape=[3])",
    "matmul(%x, %w)",
    "linear(%x, %w2)",
    "linear(%x, %w2, none)",
    "linear(%x, %w2, %v4)",
    "reshape(%x, shape=[3, -1])",
    "view(%x, shape=[6])",
    "permute(%x, dims=[1, 0])",
    "transpose(%x, dim0=0, dim1=-1)",
    "t(%x)",
    "expand(%v, size=[4, -1])",
    "squeeze(%x)",
    "squeeze(%x, dim=0)",
    "unsqueeze(%x, dim=-1)",
    "flatten(%x)",
    "flatten(%x, start_dim=1)",
    "narrow(%x, dim=1, start=1, length=2)",
    "select(%x, dim=0, index=-1)",
    "slice(%x, dim=1, start=1, step=2)",
    "slice(%x, end=-1)",
    "diagonal(%x, offset=1)",
    "contiguous(%x)",
    "repeat(%x, repeats=[2, 1, 3])",
    "cat(%x, %y, dim=1)",
    "stack(%x, %y)",
    "flip(%x, dims=[0, 1])",
    "tril(%x)",
    "triu(%x, diagonal=-1)",
    "index_select(%x, %i, dim=1)",
    "gather(%x, %j, dim=1)",
    "scatter(%x, %j, %x, dim=1)",
    "scatter_add(%x, %j, %x, dim=0)",
    "scatter_reduce(%x, %j, %x, dim=0, reduce=\"amax\")",
    "view(%x, dtype=i32)",
    "asin(%x)",
    "acos(%x)",
    "atan(%i)",
    "bitwise_and(%i, 3)",
    "bitwise_or(%m, %m)",
    "bitwise_xor(%i, %i)",
    "bitwise_not(%m)",
    "index_add(%x, %i, %y, dim=1)",
    "embedding(%i, %x)",
    "scaled_dot_product_attention(%x, %y, %x)",
    "scaled_dot_product_attention(%x, %y, %y, is_causal=true, scale=0.5)",
    "scaled_dot_product_attention_backward(%y, %x, %y, %x, is_causal=true)",
    "conv2d(%c, %k, none)",
    "conv2d(%c, %k, %v4, stride=[2, 1], padding=1, dilation=2)",
    "conv2d(%c, %k, none, padding=\"same\")",
    "conv2d(%c, %k3, none, padding=\"valid\", groups=3)",
    "conv1d(%s, %k1, %v4, stride=2, padding=1)",
    "convolution_backward_input(%go, %k, input_size=[2, 3, 6, 5])",
    "convolution_backward_weight(%go, %c, weight_size=[4, 3, 3, 3])",
    "max_pool2d(%c, kernel_size=2)",
    "max_pool2d(%c, kernel_size=[3, 2], stride=1, padding=1, dilation=[1, 2], ceil_mode=true)",
    "max_pool2d_backward(%gp, %c, kernel_size=2)",
    "avg_pool2d(%c, kernel_size=2, count_include_pad=false)",
    "avg_pool2d(%c, kernel_size=3, stride=2, padding=1, ceil_mode=true)",
    "avg_pool2d_backward(%gp, input_size=[2, 3, 6, 5], kernel_size=2)",
    "adaptive_avg_pool2d(%c, output_size=[3, 2])",
    "adaptive_avg_pool2d_backward(%gp, input_size=[2, 3, 6, 5])",
    "batch_norm(%c, %v, %v, %v, %v)",
    "batch_norm(%c, none, none, none, %v, training=true, momentum=0.2, eps=0.001)",
    "dropout(%x, p=0.2, seed=7)",
    "dropout(%x, training=false)",
    "all_reduce(%x, op=\"avg\")",
];

const HEADER: &str = "graph ops(%x: f32[2,3], %y: f32[2,3], %m: bool[2,3], %v: f32[3], \
     %w: f32[3,4], %w2: f32[4,3], %v4: f32[4], %i: i64[3], %j: i64[2,3], %c: f32[2,3,6,5], \
     %k: f32[4,3,3,3], %k3: f32[6,1,2,2], %s: f32[2,3,7], %k1: f32[4,3,3], %go: f32[2,4,4,3], \
     %gp: f32[2,3,3,2])";

fn op_graph(stmt: &str) -> String {
    // logical ops and isnan work on any dtype; the bool mask input covers where/masked_fill.
    format!("{HEADER} {{\n  %r = {stmt}\n  return %r\n}}\n")
}

#[test]
fn every_op_text_form_parses_and_prints_back() {
    for stmt in OP_STATEMENTS {
        let m = parse(&op_graph(stmt));
        assert_round_trip(&m);
    }
}

#[test]
fn the_statement_table_covers_every_op_name() {
    for name in op_names() {
        let used = OP_STATEMENTS
            .iter()
            .any(|s| s.starts_with(&format!("{name}(")));
        // einsum's shape rule is tested with its own graph below.
        assert!(used || name == "einsum", "no statement uses '{name}'");
    }
}

#[test]
fn einsum_call_builds_its_op() {
    let op = Op::from_call(
        "einsum",
        &[true, true],
        &[("equation", Attr::Str("ij,jk->ik".into()))],
    )
    .unwrap();
    assert_eq!(
        op,
        Op::Einsum {
            equation: "ij,jk->ik".into()
        }
    );
    assert_eq!(
        op.printed_attrs(),
        vec![("equation", Attr::Str("ij,jk->ik".into()))]
    );
    let e = Op::from_call("einsum", &[true], &[])
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("'einsum' requires the attribute 'equation'"),
        "{e}"
    );
}

#[test]
fn left_out_attributes_take_pytorch_defaults() {
    let op = |stmt: &str| op_of(&parse(&op_graph(stmt)), "r");
    assert_eq!(
        op("sum(%x)"),
        Op::Reduce {
            op: ReduceOp::Sum,
            dim: None,
            keepdim: false
        }
    );
    assert_eq!(op("squeeze(%x)"), Op::Squeeze { dim: None });
    assert_eq!(op("gelu(%x)"), Op::Unary(UnaryOp::Gelu { tanh: false }));
    assert_eq!(
        op("flatten(%x)"),
        Op::Flatten {
            start_dim: 0,
            end_dim: -1
        }
    );
    assert_eq!(
        op("var(%x)"),
        Op::Var {
            dim: None,
            correction: 1.0,
            keepdim: false
        }
    );
    assert_eq!(
        op("layer_norm(%x, none, none, normalized_shape=[3])"),
        Op::LayerNorm {
            normalized_shape: vec![3],
            eps: 1e-5,
            has_weight: false,
            has_bias: false
        }
    );
    assert_eq!(op("linear(%x, %w2)"), Op::Linear { has_bias: false });
    assert_eq!(op("linear(%x, %w2, none)"), Op::Linear { has_bias: false });
    assert_eq!(
        op("zeros(size=[2])"),
        Op::Full {
            size: vec![2],
            fill_value: Scalar::Int(0),
            dtype: Some(DType::F32)
        }
    );
    assert_eq!(
        op("clamp(%x, min=0.0)"),
        Op::Clamp {
            min: Some(Scalar::Float(0.0)),
            max: None
        }
    );
    assert_eq!(op("to(%x, dtype=f16)"), Op::To { dtype: DType::F16 });
    assert_eq!(
        op("prod(%x, dim=1)"),
        Op::Reduce {
            op: ReduceOp::Prod,
            dim: Some(vec![1]),
            keepdim: false
        }
    );
    assert_eq!(
        op("slice(%x, end=-1)"),
        Op::Slice {
            dim: 0,
            start: None,
            end: Some(-1),
            step: 1
        }
    );
    assert_eq!(
        op("diagonal(%x)"),
        Op::Diagonal {
            offset: 0,
            dim1: 0,
            dim2: 1
        }
    );
    assert_eq!(op("cat(%x, %y)"), Op::Cat { dim: 0 });
}

#[test]
fn bare_numbers_are_python_scalars_with_their_promotion() {
    let text = "graph g(%h: f16[2], %l: i64[2], %i: i32[2]) {
  %a = mul(%h, 0.5)
  %b = mul(%l, 0.5)
  %c = add(%i, 1)
  %d = add(%i, 1e3)
  %e = add(%l, true)
  return %a, %b, %c, %d, %e
}";
    let m = parse(text);
    let g = m.entry();
    let dt = |n: &str| g.node(g.value(n).unwrap()).ty.dtype;
    assert_eq!(dt("a"), DType::F16);
    assert_eq!(dt("b"), DType::F32);
    assert_eq!(dt("c"), DType::I32);
    assert_eq!(dt("d"), DType::F32);
    assert_eq!(dt("e"), DType::I64);
    let c = g.value("c").unwrap();
    assert_eq!(
        g.node(g.operands(c)[1]).op(),
        Some(&Op::Scalar(Scalar::Int(1)))
    );
    let d = g.value("d").unwrap();
    assert_eq!(
        g.node(g.operands(d)[1]).op(),
        Some(&Op::Scalar(Scalar::Float(1000.0)))
    );
    assert_round_trip(&m);
}

#[test]
fn nan_scalars_print_as_nan_and_read_back() {
    let m = parse("graph g(%x: f32[2]) {\n  %y = add(%x, nan)\n  return %y\n}");
    let text = print_module(&m);
    assert!(text.contains("add(%x, nan)"), "{text}");
    assert_eq!(print_module(&parse(&text)), text);
}

#[test]
fn comments_whitespace_and_several_graphs() {
    let text = "# leading comment
graph first(%x: f32[2,3]) { # trailing
  %y
    : f32[3,2]
    = transpose(%x,
                dim0=0, dim1=1)  # a statement over lines
  return %y
}

graph second(%a: i64[4]) {
  %b = neg(%a)
  return %b, %a
}
";
    let m = parse(text);
    assert_eq!(m.graphs.len(), 2);
    assert_eq!(m.entry().name, "first");
    let s = m.get("second").unwrap();
    assert_eq!(s.outputs().len(), 2);
    assert!(m.get("third").is_none());
    let e = m.graph("third").unwrap_err().to_string();
    assert!(
        e.contains("no graph named 'third'") && e.contains("first, second"),
        "{e}"
    );
    assert_round_trip(&m);
}

#[test]
fn zero_dim_types_and_named_scalars() {
    let text = "graph g(%x: f64[]) {
  %c: f64[] = scalar(value=2.0)
  %y: f64[] = mul(%x, %c)
  return %y, %c
}";
    let m = parse(text);
    assert_eq!(
        m.entry().node(m.entry().value("x").unwrap()).ty.shape,
        Vec::<usize>::new()
    );
    let out = print_module(&m);
    assert!(out.contains("%c: f64[] = scalar(value=2.0)"), "{out}");
    assert_round_trip(&m);
}

#[test]
fn constants_keep_their_exact_data() {
    for (dtype, data) in [
        ("f32", "[0.1, -0.0, inf, 3e38]"),
        ("f16", "[0.5, 65504.0, -2.0, 0.0009765625]"),
        ("bf16", "[1.0, -3.0, 0.5, 256.0]"),
        ("f64", "[0.1, 1e-300, -1e300, 2.5]"),
        ("i64", "[-9223372036854775808, 9223372036854775807, 0, 1]"),
        ("i32", "[-1, 2, 3, 4]"),
        ("u8", "[0, 255, 7, 8]"),
        ("i8", "[-128, 127, 0, 1]"),
        ("bool", "[true, false, false, true]"),
    ] {
        let text = format!(
            "graph g() {{\n  %c = constant(dtype={dtype}, shape=[2,2], data={data})\n  return %c\n}}"
        );
        let m = parse(&text);
        let Op::Constant(lit) = op_of(&m, "c") else {
            panic!("not a constant")
        };
        assert_eq!(lit.bytes.len(), 4 * lit.dtype.size());
        assert_round_trip(&m);
    }
    let m =
        parse("graph g() {\n  %c = constant(dtype=i32, shape=[2], data=[-1, 258])\n  return %c\n}");
    let Op::Constant(lit) = op_of(&m, "c") else {
        panic!("not a constant")
    };
    assert_eq!(&lit.bytes[..], &[0xff, 0xff, 0xff, 0xff, 2, 1, 0, 0]);
}

fn parse_err(text: &str) -> String {
    match parse_module(text, "model.smelt") {
        Ok(_) => panic!("parsed but should not:\n{text}"),
        Err(e @ Error::Parse { .. }) => e.to_string(),
        Err(e) => panic!("not a parse error: {e:?}"),
    }
}

#[test]
fn errors_name_file_line_column_and_what_was_expected() {
    let cases: &[(&str, &str)] = &[
        (
            "graph g(%x: f32[2]) {\n  %y = relux(%x)\n  return %y\n}",
            "model.smelt:2:8: unknown op 'relux'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %y = relu(%x\n  return %y\n}",
            "model.smelt:3:3: expected ',' or ')', found 'return'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%y)\n  return %h\n}",
            "model.smelt:2:13: use of undefined value %y",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x)\n  %h = neg(%x)\n  return %h\n}",
            "model.smelt:3:3: value %h defined twice",
        ),
        (
            "graph g(%x: f32[2,3]) {\n  %h: f32[2,3] = t(%x)\n  return %h\n}",
            "model.smelt:2:7: type annotation f32[2,3] does not match inferred f32[3,2]",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x)\n  return %z\n}",
            "model.smelt:3:10: use of undefined value %z",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = sum(%x, dims=[0])\n  return %h\n}",
            "model.smelt:2:16: unknown attribute 'dims' for op 'sum'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = sum(%x, keepdim=1.5)\n  return %h\n}",
            "model.smelt:2:16: attribute 'keepdim' of 'sum' expects true or false, got a float (1.5)",
        ),
        (
            "graph g(%x: f32[2,3]) {\n  %h = transpose(%x, dim0=0)\n  return %h\n}",
            "model.smelt:2:8: 'transpose' requires the attribute 'dim1'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = add(%x, %x, %x)\n  return %h\n}",
            "model.smelt:2:8: add: add() takes 2 tensor operands, but 3 were given",
        ),
        (
            "graph g(%x: f32[2], %y: f32[3]) {\n  %h = add(%x, %y)\n  return %h\n}",
            "model.smelt:2:8: add: The size of tensor a (2) must match the size of tensor b (3) at non-singleton dimension 0",
        ),
        (
            "graph g(%x: f33[2]) {\n  return %x\n}",
            "model.smelt:1:13: unknown dtype 'f33'",
        ),
        ("", "model.smelt:1:1: expected 'graph', found end of file"),
        (
            "graf g() {}",
            "model.smelt:1:1: expected 'graph', found 'graf'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x)\n}",
            "model.smelt:3:1: expected a statement or 'return', found '}'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = sum(dim=0, %x)\n  return %h\n}",
            "model.smelt:2:19: positional operands must come before name=value attributes",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = sum(%x, dim=0, dim=0)\n  return %h\n}",
            "model.smelt:2:23: attribute 'dim' given twice",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x)\n  return %h\n}\ngraph g(%x: f32[2]) {\n  return %x\n}",
            "model.smelt:5:1: graph 'g' defined twice",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = gelu(%x, approximate=\"fast\")\n  return %h\n}",
            "model.smelt:2:17: attribute 'approximate' of 'gelu' must be \"none\" or \"tanh\", got \"fast\"",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(none)\n  return %h\n}",
            "model.smelt:2:8: 'relu' needs a tensor as operand 0, got none",
        ),
        (
            "graph g(%x: f32[2], %x: f32[2]) {\n  return %x\n}",
            "model.smelt:1:21: value %x defined twice",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = add(%x, 99999999999999999999)\n  return %h\n}",
            "model.smelt:2:16: integer 99999999999999999999 does not fit in 64 bits",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = add(%x, 1.)\n  return %h\n}",
            "model.smelt:2:16: expected digits after '1.'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x) !\n}",
            "model.smelt:2:17: unexpected character '!'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = relu(%x) @\n}",
            "model.smelt:2:17: expected a graph name after '@'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = to(%x, dtype=\"f16)\n  return %h\n}",
            "model.smelt:2:21: unterminated string: expected '\"'",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = reshape(%x, shape=[2, x])\n  return %h\n}",
            // a bare word is a symbolic size (version 3), which this reader does not take
            "model.smelt:2:30: symbolic size x: a graph with symbols is read by SymbolicModule::parse (or `smelt run`, which sizes them from the inputs)",
        ),
        (
            "graph g(%x: f32[2]) {\n  %h = prod(%x, dim=[0, 0])\n  return %h\n}",
            "model.smelt:2:17: attribute 'dim' of 'prod' expects one int",
        ),
        (
            "graph g(%x: f32[2,-1]) {\n  return %x\n}",
            "model.smelt:1:19: expected a dimension size, found -1",
        ),
    ];
    for (text, want) in cases {
        assert_eq!(&parse_err(text), want, "for\n{text}");
    }
}

#[test]
fn verifier_rejects_bad_graphs() {
    let mut b = GraphBuilder::new("g");
    let x = b.input("x", DType::F32, &[2, 3]).unwrap();
    let r = b.relu(x).unwrap();
    let good = b.finish(&[r]).unwrap();

    // no outputs, and outputs that are not values
    let mut g = good.clone();
    g.set_outputs(vec![]);
    assert!(g.verify().unwrap_err().to_string().contains("no outputs"));
    g.set_outputs(vec![ValueId::new(99)]);
    assert!(
        g.verify()
            .unwrap_err()
            .to_string()
            .contains("output 0 is not a value")
    );

    // a recorded type that is not what the op infers
    let mut g = good.clone();
    g.petgraph_mut()[r].ty = TensorType::new(DType::F32, vec![3, 2]);
    let e = g.verify().unwrap_err().to_string();
    assert!(
        e.contains("%0 is recorded as f32[3,2] but relu infers f32[2,3]"),
        "{e}"
    );

    // operand arity
    let mut g = good.clone();
    g.petgraph_mut().add_edge(x, r, 1);
    let e = g.verify().unwrap_err().to_string();
    assert!(
        e.contains("relu() takes 1 tensor operand, but 2 were given"),
        "{e}"
    );

    // operand positions with a hole
    let mut g = good.clone();
    let e0 = g.petgraph().find_edge(x, r).unwrap();
    g.petgraph_mut()[e0] = 1;
    let e = g.verify().unwrap_err().to_string();
    assert!(e.contains("operand positions [1]"), "{e}");

    // a cycle
    let mut g = good.clone();
    g.petgraph_mut().add_edge(r, x, 0);
    assert!(g.verify().unwrap_err().to_string().contains("cycle"));

    // duplicate names (a node renamed behind the name table's back)
    let mut g = good.clone();
    g.petgraph_mut()[r].name = "x".into();
    assert!(
        g.verify()
            .unwrap_err()
            .to_string()
            .contains("defined twice")
    );

    // an anonymous scalar cannot be an output
    let mut g = good.clone();
    let s = g.add_scalar(1.5).unwrap();
    g.set_outputs(vec![s]);
    assert!(
        g.verify()
            .unwrap_err()
            .to_string()
            .contains("anonymous scalar")
    );

    good.verify().unwrap();
}

#[test]
fn graph_api_rejects_bad_input() {
    let mut g = Graph::new("g");
    let x = g
        .add_input("x", TensorType::new(DType::F32, vec![2]))
        .unwrap();
    assert!(
        g.add_input("x", TensorType::new(DType::F32, vec![2]))
            .is_err()
    );
    assert!(
        g.add_input("bad name", TensorType::new(DType::F32, vec![2]))
            .is_err()
    );
    let e = g
        .add_op(Op::Binary(BinaryOp::Add), &[x])
        .unwrap_err()
        .to_string();
    assert!(e.contains("add() takes 2 tensor operands"), "{e}");
    let e = g
        .add_op(Op::Unary(UnaryOp::Relu), &[ValueId::new(42)])
        .unwrap_err()
        .to_string();
    assert!(e.contains("not a value of this graph"), "{e}");
    let y = g.add_op_named(Op::Unary(UnaryOp::Neg), &[x], "y").unwrap();
    assert!(g.add_op_named(Op::Unary(UnaryOp::Neg), &[x], "y").is_err());
    let z = g.add_op(Op::Binary(BinaryOp::Mul), &[y, x]).unwrap();
    assert_eq!(g.operands(z), vec![y, x]);
    assert_eq!(g.users(x), vec![y, z]);
    assert_eq!(g.topo_order(), vec![x, y, z]);
}

#[test]
fn dot_output_names_every_value() {
    let m = parse(EXAMPLE);
    let dot = m.entry().to_dot();
    assert!(dot.starts_with("digraph"), "{dot}");
    for want in [
        "%x = input",
        "%h = linear",
        "%a = relu",
        "%m = sum",
        "f32[256,1]",
        "scalar 0.5",
    ] {
        assert!(dot.contains(want), "missing {want} in\n{dot}");
    }
    assert_eq!(dot.matches("->").count(), 7);
}

// ---- random graphs ---------------------------------------------------------------------

const SCALARS: &[Scalar] = &[
    Scalar::Float(0.5),
    Scalar::Float(-1.25),
    Scalar::Float(1e-5),
    Scalar::Float(1e300),
    Scalar::Float(f64::INFINITY),
    Scalar::Float(f64::NEG_INFINITY),
    Scalar::Int(2),
    Scalar::Int(-3),
    Scalar::Int(i64::MIN),
    Scalar::Bool(true),
];

/// One step of a random program: an op choice and raw numbers to pick operands and attributes.
type Step = (u8, usize, usize, i64);

/// Tries to add one op chosen by `step`; ops whose shape rule refuses the operands are skipped.
fn add_step(b: &mut GraphBuilder, vals: &mut Vec<ValueId>, (k, p, q, n): Step) {
    let x = vals[p % vals.len()];
    let y = vals[q % vals.len()];
    let nd = b.ty(x).ndim() as i64;
    let d = n;
    let scalar = SCALARS[q % SCALARS.len()];
    let unary = [
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Sqrt,
        UnaryOp::Sigmoid,
        UnaryOp::Relu,
        UnaryOp::Gelu { tanh: true },
        UnaryOp::Silu,
        UnaryOp::Floor,
        UnaryOp::Sign,
        UnaryOp::LogicalNot,
        UnaryOp::IsNan,
    ];
    let binary = [
        BinaryOp::Add,
        BinaryOp::Sub,
        BinaryOp::Mul,
        BinaryOp::Div,
        BinaryOp::Pow,
        BinaryOp::Maximum,
        BinaryOp::Remainder,
        BinaryOp::Lt,
        BinaryOp::Eq,
        BinaryOp::LogicalOr,
    ];
    let shape: Vec<i64> = b.ty(x).shape.iter().map(|&s| s as i64).collect();
    let r = match k % 30 {
        0 => b.unary(unary[q % unary.len()], x),
        1 => b.binary(binary[n.unsigned_abs() as usize % binary.len()], x, y),
        2 => b.binary_scalar(binary[p % binary.len()], x, scalar),
        3 => b.op(
            Op::Reduce {
                op: [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Amax, ReduceOp::Any][q % 4],
                dim: (n % 2 == 0).then(|| vec![d]),
                keepdim: q % 3 == 0,
            },
            &[x],
        ),
        4 => b.op(
            Op::Reduce {
                op: ReduceOp::Prod,
                dim: Some(vec![d]),
                keepdim: false,
            },
            &[x],
        ),
        5 => b.op(
            Op::ArgMax {
                dim: (q % 2 == 0).then_some(d),
                keepdim: n % 2 == 0,
            },
            &[x],
        ),
        6 => b.op(
            Op::Var {
                dim: Some(vec![d]),
                correction: (q % 3) as f64,
                keepdim: true,
            },
            &[x],
        ),
        7 => b.op(Op::Softmax { dim: d }, &[x]),
        8 => b.op(Op::Cumsum { dim: d }, &[x]),
        9 => {
            let Some(&last) = b.ty(x).shape.last() else {
                return;
            };
            b.op(
                Op::LayerNorm {
                    normalized_shape: vec![last],
                    eps: 1e-3,
                    has_weight: false,
                    has_bias: false,
                },
                &[x],
            )
        }
        10 => b.matmul(x, y),
        11 => b.op(Op::Linear { has_bias: false }, &[x, y]),
        12 => b.reshape(x, &[-1]),
        13 => {
            let dims: Vec<i64> = (0..nd).rev().collect();
            b.permute(x, &dims)
        }
        14 => b.transpose(x, d, 0),
        15 => b.op(Op::Squeeze { dim: None }, &[x]),
        16 => b.op(Op::Unsqueeze { dim: d }, &[x]),
        17 => b.op(
            Op::Slice {
                dim: d,
                start: (q % 2 == 0).then_some(n / 2),
                end: None,
                step: 1 + (q % 3) as i64,
            },
            &[x],
        ),
        18 => b.op(
            Op::Narrow {
                dim: d,
                start: 0,
                length: 1,
            },
            &[x],
        ),
        19 => b.op(Op::Select { dim: d, index: -1 }, &[x]),
        20 => b.op(Op::Cat { dim: d }, &[x, y]),
        21 => b.op(Op::Stack { dim: 0 }, &[x, y]),
        22 => b.op(Op::Flip { dims: vec![d] }, &[x]),
        23 => b.op(Op::Triu { diagonal: n }, &[x]),
        24 => b.op(
            Op::Expand {
                size: std::iter::once(2).chain(shape.iter().copied()).collect(),
            },
            &[x],
        ),
        25 => b.to(x, [DType::F16, DType::I32, DType::Bool, DType::BF16][q % 4]),
        26 => b.op(
            Op::Clamp {
                min: Some(scalar),
                max: None,
            },
            &[x],
        ),
        27 => b.op(
            Op::Full {
                size: vec![(q % 3) + 1],
                fill_value: scalar,
                dtype: None,
            },
            &[],
        ),
        28 => {
            let bytes: Vec<u8> = (0..8).map(|i| (i as u8).wrapping_mul(q as u8)).collect();
            b.op(
                Op::Constant(Literal {
                    dtype: DType::I32,
                    shape: vec![2],
                    bytes: Arc::new(bytes),
                }),
                &[],
            )
        }
        _ => b.op(
            Op::Diagonal {
                offset: n,
                dim1: 0,
                dim2: -1,
            },
            &[x],
        ),
    };
    if let Ok(v) = r {
        vals.push(v);
    }
}

fn random_graph(shapes: &[Vec<usize>], steps: &[Step], outs: &[usize]) -> Graph {
    let mut b = GraphBuilder::new("random");
    let mut vals = Vec::new();
    for (i, s) in shapes.iter().enumerate() {
        let dtype = [DType::F32, DType::I64, DType::F16][i % 3];
        vals.push(b.input(&format!("in{i}"), dtype, s).unwrap());
    }
    for &s in steps {
        add_step(&mut b, &mut vals, s);
    }
    let outputs: Vec<ValueId> = outs.iter().map(|&o| vals[o % vals.len()]).collect();
    b.finish(&outputs).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn random_graphs_round_trip_through_text(
        shapes in prop::collection::vec(prop::collection::vec(1usize..4, 0..4), 1..4),
        steps in prop::collection::vec((any::<u8>(), any::<usize>(), any::<usize>(), -3i64..4), 1..25),
        outs in prop::collection::vec(any::<usize>(), 1..4),
    ) {
        let g = random_graph(&shapes, &steps, &outs);
        let text = print_graph(&g);
        let back = parse_module(&text, "random.smelt").map_err(|e| TestCaseError::fail(format!("{e}\n{text}")))?;
        prop_assert_eq!(back.graphs.len(), 1);
        prop_assert!(back.entry() == &g, "round trip changed the graph:\n{}", text);
        let again = print_graph(back.entry());
        prop_assert_eq!(again, text);
        // every op node kept its kind
        let ops = |g: &Graph| g.topo_order().into_iter().filter(|&v| matches!(g.node(v).kind, NodeKind::Op(_)) && !g.node(v).is_inline_scalar()).count();
        prop_assert_eq!(ops(back.entry()), ops(&g));
    }
}

/// Every op the format knows has its line in docs/ir-format.md: an op whose docs line was
/// forgotten fails here by name.
#[test]
fn every_op_name_is_documented() {
    let doc =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/ir-format.md")).unwrap();
    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
    for name in op_names() {
        let found = doc.match_indices(name).any(|(i, _)| {
            let before = doc[..i].chars().next_back().is_none_or(|c| !word(c));
            let after = doc[i + name.len()..]
                .chars()
                .next()
                .is_none_or(|c| !word(c));
            before && after
        });
        assert!(found, "docs/ir-format.md does not mention the op '{name}'");
    }
}

#[test]
fn all_reduce_reads_prints_and_refuses_bad_reduce_ops() {
    use smelt::ir::collective::ReduceOp as Collective;
    let m = parse(
        "graph g(%x: f32[3]) {\n  %s = all_reduce(%x, op=\"avg\")\n  %t = all_reduce(%s)\n  return %t\n}\n",
    );
    assert_eq!(
        op_of(&m, "s"),
        Op::AllReduce {
            op: Collective::Avg
        }
    );
    // PyTorch's default is a sum
    assert_eq!(
        op_of(&m, "t"),
        Op::AllReduce {
            op: Collective::Sum
        }
    );
    assert_round_trip(&m);
    let bad = parse_module(
        "graph g(%x: f32[3]) {\n  %s = all_reduce(%x, op=\"mean\")\n  return %s\n}\n",
        "t.smelt",
    )
    .unwrap_err()
    .to_string();
    assert!(bad.contains("unknown reduce op \"mean\""), "{bad}");
    // an average of integers is refused, as torch.distributed refuses it
    let ints = parse_module(
        "graph g(%x: i64[3]) {\n  %s = all_reduce(%x, op=\"avg\")\n  return %s\n}\n",
        "t.smelt",
    )
    .unwrap_err()
    .to_string();
    assert!(
        ints.contains("ReduceOp.AVG needs a floating-point tensor"),
        "{ints}"
    );
}
