//! Parity of ahead-of-time models with the JIT, op by op: every op name of the text format
//! (`smelt::ir::attrs::op_names`, and the control ops) has a one-op graph here, in the
//! dtypes the JIT compiles it for; each graph that the JIT compiles must compile ahead of
//! time too. `GAPS` (tests/common/aot_gaps.rs) lists the ops AOT refuses today with the reason, checked both ways: an
//! op refused and not listed fails, and so does a listed op that compiles (take it off the
//! list), so the list only shrinks. `EXCLUDED` holds the ops that stay out by design.
//! Only compiling is checked here; tests/aot.rs runs the objects.

mod common;

use common::aot_gaps::{EXCLUDED, GAPS};
use smelt::aot::AotOptions;
use smelt::ir::text::parse_module;
use std::collections::{BTreeMap, BTreeSet};

/// One-op graphs of the ops outside the unary, binary and reduction families, keyed by
/// op name (the key may add a dtype: `matmul i64`).
fn structural() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "scalar",
            "(%x: f32[3]) {\n  %c = scalar(value=0.5)\n  %y = mul(%x, %c)\n  return %y\n}",
        ),
        (
            "constant",
            "(%x: f32[2]) {\n  %c: f32[2] = constant(dtype=f32, shape=[2], data=[1.5, -2])\n  %y = add(%x, %c)\n  return %y\n}",
        ),
        (
            "full",
            "(%x: f32[2,3]) {\n  %c = full(size=[2, 3], fill_value=2.0, dtype=f32)\n  %y = add(%x, %c)\n  return %y\n}",
        ),
        (
            "zeros",
            "(%x: f32[2,3]) {\n  %c = zeros(size=[2, 3], dtype=f32)\n  %y = add(%x, %c)\n  return %y\n}",
        ),
        (
            "ones",
            "(%x: f32[2,3]) {\n  %c = ones(size=[2, 3], dtype=f32)\n  %y = add(%x, %c)\n  return %y\n}",
        ),
        (
            "arange",
            "(%x: f32[5]) {\n  %c = arange(start=0, end=5, step=1, dtype=f32)\n  %y = add(%x, %c)\n  return %y\n}",
        ),
        (
            "where",
            "(%c: bool[2,3], %x: f32[2,3], %y: f32[3]) {\n  %z = where(%c, %x, %y)\n  return %z\n}",
        ),
        (
            "clamp",
            "(%x: f32[2,3]) {\n  %y = clamp(%x, min=-1.0, max=1.0)\n  return %y\n}",
        ),
        (
            "to",
            "(%x: f32[2,3]) {\n  %y = to(%x, dtype=f16)\n  return %y\n}",
        ),
        (
            "masked_fill",
            "(%x: f32[2,3], %m: bool[2,3]) {\n  %y = masked_fill(%x, %m, value=0.5)\n  return %y\n}",
        ),
        (
            "argmax",
            "(%x: f32[2,3]) {\n  %y = argmax(%x, dim=1)\n  return %y\n}",
        ),
        (
            "argmin",
            "(%x: f32[2,3]) {\n  %y = argmin(%x, dim=0, keepdim=true)\n  return %y\n}",
        ),
        (
            "var",
            "(%x: f32[2,3]) {\n  %y = var(%x, dim=[1], correction=1)\n  return %y\n}",
        ),
        (
            "std",
            "(%x: f32[2,3]) {\n  %y = std(%x, dim=[0], correction=0)\n  return %y\n}",
        ),
        (
            "cumsum",
            "(%x: f32[2,3]) {\n  %y = cumsum(%x, dim=1)\n  return %y\n}",
        ),
        (
            "softmax",
            "(%x: f32[2,3]) {\n  %y = softmax(%x, dim=1)\n  return %y\n}",
        ),
        (
            "log_softmax",
            "(%x: f32[2,3]) {\n  %y = log_softmax(%x, dim=0)\n  return %y\n}",
        ),
        (
            "layer_norm",
            "(%x: f32[2,3], %w: f32[3], %b: f32[3]) {\n  %y = layer_norm(%x, %w, %b, normalized_shape=[3], eps=1e-5)\n  return %y\n}",
        ),
        (
            "matmul",
            "(%a: f32[2,3], %b: f32[3,4]) {\n  %y = matmul(%a, %b)\n  return %y\n}",
        ),
        (
            "matmul f64",
            "(%a: f64[2,3], %b: f64[5,3,4]) {\n  %y = matmul(%a, %b)\n  return %y\n}",
        ),
        (
            "matmul f16",
            "(%a: f16[2,3], %b: f16[5,3,4]) {\n  %y = matmul(%a, %b)\n  return %y\n}",
        ),
        (
            "matmul i64",
            "(%a: i64[2,3], %b: i64[3,4]) {\n  %y = matmul(%a, %b)\n  return %y\n}",
        ),
        (
            "linear",
            "(%x: f32[2,3], %w: f32[4,3], %b: f32[4]) {\n  %y = linear(%x, %w, %b)\n  return %y\n}",
        ),
        (
            "einsum",
            "(%a: f32[2,3], %b: f32[3,4]) {\n  %y = einsum(%a, %b, equation=\"ij,jk->ik\")\n  return %y\n}",
        ),
        (
            "scaled_dot_product_attention",
            "(%q: f32[2,4,8], %k: f32[2,5,8], %v: f32[2,5,8]) {\n  %y = scaled_dot_product_attention(%q, %k, %v, is_causal=true)\n  return %y\n}",
        ),
        (
            "scaled_dot_product_attention_backward",
            "(%g: f32[2,4,8], %q: f32[2,4,8], %k: f32[2,5,8], %v: f32[2,5,8]) {\n  %y = scaled_dot_product_attention_backward(%g, %q, %k, %v)\n  return %y\n}",
        ),
        (
            "reshape",
            "(%x: f32[2,3]) {\n  %t = transpose(%x, dim0=0, dim1=1)\n  %y = reshape(%t, shape=[6])\n  return %y\n}",
        ),
        (
            "view",
            "(%x: f32[2,3]) {\n  %y = view(%x, shape=[3, 2])\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "permute",
            "(%x: f32[2,3,4]) {\n  %y = permute(%x, dims=[2, 0, 1])\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "transpose",
            "(%x: f32[2,3]) {\n  %y = transpose(%x, dim0=0, dim1=1)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "t",
            "(%x: f32[2,3]) {\n  %y = t(%x)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "expand",
            "(%x: f32[1,3]) {\n  %y = expand(%x, size=[4, 3])\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "squeeze",
            "(%x: f32[1,3]) {\n  %y = squeeze(%x, dim=0)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "unsqueeze",
            "(%x: f32[3]) {\n  %y = unsqueeze(%x, dim=1)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "flatten",
            "(%x: f32[2,3,4]) {\n  %y = flatten(%x, start_dim=1, end_dim=2)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "narrow",
            "(%x: f32[5,3]) {\n  %y = narrow(%x, dim=0, start=1, length=3)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "select",
            "(%x: f32[5,3]) {\n  %y = select(%x, dim=1, index=2)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "slice",
            "(%x: f32[9,3]) {\n  %y = slice(%x, dim=0, start=1, end=8, step=3)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "diagonal",
            "(%x: f32[4,3]) {\n  %y = diagonal(%x, offset=1)\n  %z = neg(%y)\n  return %z\n}",
        ),
        (
            "contiguous",
            "(%x: f32[4,3]) {\n  %t = t(%x)\n  %y = contiguous(%t)\n  return %y\n}",
        ),
        (
            "repeat",
            "(%x: f32[2,3]) {\n  %y = repeat(%x, repeats=[2, 1, 2])\n  return %y\n}",
        ),
        (
            "cat",
            "(%a: f32[2,3], %b: f32[4,3]) {\n  %y = cat(%a, %b, dim=0)\n  return %y\n}",
        ),
        (
            "stack",
            "(%a: f32[2,3], %b: f32[2,3]) {\n  %y = stack(%a, %b, dim=2)\n  return %y\n}",
        ),
        (
            "flip",
            "(%x: f32[2,3]) {\n  %y = flip(%x, dims=[1])\n  return %y\n}",
        ),
        (
            "tril",
            "(%x: f32[3,3]) {\n  %y = tril(%x, diagonal=0)\n  return %y\n}",
        ),
        (
            "triu",
            "(%x: f32[3,3]) {\n  %y = triu(%x, diagonal=1)\n  return %y\n}",
        ),
        (
            "index_select",
            "(%x: f32[5,3], %i: i64[4]) {\n  %y = index_select(%x, %i, dim=0)\n  return %y\n}",
        ),
        (
            "gather",
            "(%x: f32[5,3], %i: i64[5,2]) {\n  %y = gather(%x, %i, dim=1)\n  return %y\n}",
        ),
        (
            "scatter",
            "(%x: f32[5,3], %i: i64[2,3], %s: f32[2,3]) {\n  %y = scatter(%x, %i, %s, dim=0)\n  return %y\n}",
        ),
        (
            "scatter_add",
            "(%x: f32[5,3], %i: i64[2,3], %s: f32[2,3]) {\n  %y = scatter_add(%x, %i, %s, dim=0)\n  return %y\n}",
        ),
        (
            "scatter_reduce",
            "(%x: f32[5,3], %i: i64[2,3], %s: f32[2,3]) {\n  %y = scatter_reduce(%x, %i, %s, dim=0, reduce=\"amax\")\n  return %y\n}",
        ),
        (
            "index_add",
            "(%x: f32[5,3], %i: i64[2], %s: f32[2,3]) {\n  %y = index_add(%x, %i, %s, dim=0)\n  return %y\n}",
        ),
        (
            "embedding",
            "(%i: i64[2,3], %w: f32[10,4]) {\n  %y = embedding(%i, %w)\n  return %y\n}",
        ),
        (
            "conv1d",
            "(%x: f32[1,2,9], %w: f32[3,2,3]) {\n  %y = conv1d(%x, %w, none)\n  return %y\n}",
        ),
        (
            "conv2d",
            "(%x: f32[1,2,6,6], %w: f32[3,2,3,3], %b: f32[3]) {\n  %y = conv2d(%x, %w, %b, padding=[1, 1])\n  return %y\n}",
        ),
        (
            "conv2d f16",
            "(%x: f16[1,2,6,6], %w: f16[3,2,3,3]) {\n  %y = conv2d(%x, %w, none)\n  return %y\n}",
        ),
        (
            "conv2d bf16",
            "(%x: bf16[1,2,6,6], %w: bf16[3,2,3,3]) {\n  %y = conv2d(%x, %w, none)\n  return %y\n}",
        ),
        (
            "convolution_backward_input",
            "(%g: f32[1,3,4,4], %w: f32[3,2,3,3]) {\n  %y = convolution_backward_input(%g, %w, input_size=[1, 2, 6, 6])\n  return %y\n}",
        ),
        (
            "convolution_backward_weight",
            "(%g: f32[1,3,4,4], %x: f32[1,2,6,6]) {\n  %y = convolution_backward_weight(%g, %x, weight_size=[3, 2, 3, 3])\n  return %y\n}",
        ),
        (
            "max_pool2d",
            "(%x: f32[1,2,6,6]) {\n  %y = max_pool2d(%x, kernel_size=[2, 2])\n  return %y\n}",
        ),
        (
            "max_pool2d_backward",
            "(%g: f32[1,2,3,3], %x: f32[1,2,6,6]) {\n  %y = max_pool2d_backward(%g, %x, kernel_size=[2, 2])\n  return %y\n}",
        ),
        (
            "avg_pool2d",
            "(%x: f32[1,2,6,6]) {\n  %y = avg_pool2d(%x, kernel_size=[2, 2])\n  return %y\n}",
        ),
        (
            "avg_pool2d_backward",
            "(%g: f32[1,2,3,3]) {\n  %y = avg_pool2d_backward(%g, kernel_size=[2, 2], input_size=[1, 2, 6, 6])\n  return %y\n}",
        ),
        (
            "adaptive_avg_pool2d",
            "(%x: f32[1,2,6,6]) {\n  %y = adaptive_avg_pool2d(%x, output_size=[2, 3])\n  return %y\n}",
        ),
        (
            "adaptive_avg_pool2d_backward",
            "(%g: f32[1,2,2,3]) {\n  %y = adaptive_avg_pool2d_backward(%g, input_size=[1, 2, 6, 6])\n  return %y\n}",
        ),
        (
            "batch_norm",
            "(%x: f32[2,3,4,4], %m: f32[3], %v: f32[3], %w: f32[3], %b: f32[3]) {\n  %y = batch_norm(%x, %m, %v, %w, %b, eps=1e-5)\n  return %y\n}",
        ),
        (
            "dropout",
            "(%x: f32[4,4]) {\n  %y = dropout(%x, p=0.5, training=true)\n  return %y\n}",
        ),
        (
            "all_reduce",
            "(%x: f32[4]) {\n  %y = all_reduce(%x, op=\"sum\")\n  return %y\n}",
        ),
        (
            "cond",
            "(%p: bool[], %x: f32[3]) {\n  %y = cond(%p, %x, then=@pos, else=@neg)\n  return %y\n}\ngraph pos(%x: f32[3]) {\n  %y = relu(%x)\n  return %y\n}\ngraph neg(%x: f32[3]) {\n  %y = neg(%x)\n  return %y\n}",
        ),
        (
            "while_loop",
            "(%x: f32[3]) {\n  %y = while_loop(%x, cond=@small, body=@grow)\n  return %y\n}\ngraph small(%x: f32[3]) {\n  %s = sum(%x)\n  %c = lt(%s, 100.0)\n  return %c\n}\ngraph grow(%x: f32[3]) {\n  %y = add(%x, 1.0)\n  return %y\n}",
        ),
        (
            "fori_loop",
            "(%n: i64[], %x: f32[3]) {\n  %y = fori_loop(0, %n, %x, body=@step)\n  return %y\n}\ngraph step(%i: i64[], %x: f32[3]) {\n  %y = mul(%x, 2.0)\n  return %y\n}",
        ),
        (
            "scan",
            "(%c: f32[3], %xs: f32[5,3]) {\n  %d, %ys: f32[5,3] = scan(%c, %xs, body=@s, carries=1)\n  return %d, %ys\n}\ngraph s(%c: f32[3], %x: f32[3]) {\n  %d = add(%c, %x)\n  %y = mul(%d, 2.0)\n  return %d, %y\n}",
        ),
    ]
}

/// Every case: a key (op name, with a dtype for the families) and its module text.
fn cases() -> Vec<(String, String)> {
    let mut v: Vec<(String, String)> = structural()
        .into_iter()
        .map(|(k, body)| (k.to_string(), format!("graph case{body}\n")))
        .collect();
    use smelt::ir::op::{BinaryOp, ReduceOp, UnaryOp};
    // each family: its names, the dtypes tried, its parameters and its call (`OP` the name)
    let unary: Vec<&str> = UnaryOp::ALL.iter().map(|u| u.name()).collect();
    let binary: Vec<&str> = BinaryOp::ALL.iter().map(|b| b.name()).collect();
    let reduce: Vec<&str> = ReduceOp::ALL.iter().map(|r| r.name()).collect();
    let families = [
        (unary, ["f32", "f64", "f16", "i64"], "%x: D[3,5]", "OP(%x)"),
        (
            binary,
            ["f32", "f64", "i64", "bool"],
            "%x: D[3,5], %y: D[5]",
            "OP(%x, %y)",
        ),
        (
            reduce,
            ["f32", "f64", "i64", "bool"],
            "%x: D[3,5]",
            "OP(%x, dim=1)",
        ),
    ];
    for (names, dtypes, params, call) in families {
        for name in names {
            for dt in dtypes {
                let body = format!(
                    "graph case({}) {{\n  %out = {}\n  return %out\n}}\n",
                    params.replace('D', dt),
                    call.replace("OP", name)
                );
                v.push((format!("{name} {dt}"), body));
            }
        }
    }
    v
}

/// The op name of a case key (`matmul i64` -> `matmul`).
fn op_of(key: &str) -> &str {
    key.split(' ').next().unwrap_or(key)
}

#[test]
fn every_op_the_jit_compiles_compiles_ahead_of_time() {
    let cases = cases();
    // every op of the text format has a case
    let covered: BTreeSet<&str> = cases.iter().map(|(k, _)| op_of(k)).collect();
    let names = smelt::ir::attrs::op_names();
    let missing: Vec<&&str> = names.iter().filter(|n| !covered.contains(**n)).collect();
    assert!(missing.is_empty(), "ops without a case here: {missing:?}");

    let gaps: BTreeMap<&str, &str> = GAPS.iter().copied().collect();
    let mut refused: BTreeMap<String, String> = BTreeMap::new();
    let mut parsed: BTreeSet<String> = BTreeSet::new();
    let mut jit_only = 0;
    let mut both = 0;
    for (key, text) in &cases {
        // a form the text format does not take (a dtype an op rejects) is not a case
        let Ok(m) = parse_module(text, key) else {
            continue;
        };
        parsed.insert(op_of(key).to_string());
        let g = &m.graphs[0];
        if smelt::exec::CompiledFn::compile(g, &Default::default()).is_err() {
            continue;
        }
        jit_only += 1;
        match smelt::aot::compile(g, &AotOptions::default()) {
            Ok(_) => both += 1,
            Err(e) => {
                refused.insert(key.clone(), e.to_string());
            }
        }
    }
    // a case that does not parse is skipped, but every op parses in some dtype
    let unparsed: Vec<&&str> = names.iter().filter(|n| !parsed.contains(**n)).collect();
    assert!(
        unparsed.is_empty(),
        "no case of these ops parses: {unparsed:?}"
    );
    // a refusal is listed by its key or by its op name
    let excluded: BTreeMap<&str, &str> = EXCLUDED.iter().copied().collect();
    for (k, e) in &refused {
        if excluded.contains_key(op_of(k)) {
            assert!(e.contains(op_of(k)), "{k}: the refusal names the op: {e}");
        }
    }
    let listed = |k: &str| {
        gaps.contains_key(k) || gaps.contains_key(op_of(k)) || excluded.contains_key(op_of(k))
    };
    let unlisted: Vec<String> = refused
        .iter()
        .filter(|(k, _)| !listed(k))
        .map(|(k, e)| format!("{k}: {e}"))
        .collect();
    let stale: Vec<&&str> = gaps
        .keys()
        .filter(|g| {
            let hit = |k: &String| k == **g || op_of(k) == **g;
            !refused.keys().any(hit)
        })
        .collect();
    eprintln!(
        "{jit_only} cases the JIT compiles, {both} of them ahead of time; {} refused",
        refused.len()
    );
    assert!(
        unlisted.is_empty(),
        "AOT refuses what the JIT compiles:\n{}",
        unlisted.join("\n")
    );
    assert!(
        stale.is_empty(),
        "these compile ahead of time now: take them off GAPS: {stale:?}"
    );
}
