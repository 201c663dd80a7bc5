//! The graph IR and its `.smelt` text form: parsing, printing, round trips, errors,
//! the verifier and Graphviz output.

use smelt::ir::{parse_module, print_graph, print_module};

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

#[test]
fn spec_example_parses_and_round_trips() {
    let m = parse_module(EXAMPLE, "example.smelt").unwrap();
    let text = print_module(&m);
    println!("{text}");
    let again = parse_module(&text, "printed.smelt").unwrap();
    assert_eq!(m, again);
    assert_eq!(print_graph(again.entry()), text);
}
