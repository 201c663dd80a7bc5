mod common;
#[test]
fn smoke() {
    let text = std::fs::read_to_string("/tmp/cf/issue.smelt").unwrap();
    let m = smelt::ir::parse_module(&text, "issue.smelt").unwrap();
    println!("{}", smelt::ir::text::print_module(&m));
}
