use smelt::codegen_cpu::{CodegenOptions, compile_kernel};
use smelt::exec::{CompileOptions, CompiledFn};
use smelt::kernel::Step;
#[test]
fn k49_props() {
    let src = std::fs::read_to_string("/tmp/sm/k49.smelt").unwrap();
    let m = smelt::ir::parse_module(&src, "k49").unwrap();
    let f = CompiledFn::compile(&m.graphs[0], &CompileOptions::default()).unwrap();
    let s = f.schedule();
    for st in &s.steps {
        if let Step::Kernel(k) = st {
            let ck = compile_kernel(k, &s.buffers, &CodegenOptions::default()).unwrap();
            println!(
                "{}: rows {} vector {} strip {} cached {} lanes {} colsums {}",
                k.name,
                ck.rows(),
                ck.vector_loops(),
                ck.strip_loops(),
                ck.cached_rows(),
                ck.lane_rows(),
                ck.column_sums()
            );
        }
    }
}
