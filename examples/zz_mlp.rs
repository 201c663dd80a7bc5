use smelt::codegen_cpu::CompileOptions;
use smelt::nn::functional::{Reduction, mse_loss};
use smelt::nn::{Linear, Module, ReLU, Sequential};
use smelt::optim::SGDConfig;
use smelt::train::CompiledStep;
use smelt::{Generator, Result, Tensor};
fn main() -> Result<()> {
    let mut g = Generator::new(1);
    let x = Tensor::randn_with(&[256, 1024], None, &mut g)?;
    let y = Tensor::randn_with(&[256, 1024], None, &mut g)?;
    let m = Sequential::new()
        .add(Linear::new(1024, 4096, true)?)
        .add(ReLU::new())
        .add(Linear::new(4096, 1024, true)?);
    let step = CompiledStep::new(
        |xs: &[Tensor]| mse_loss(&m.forward(&xs[0])?, &xs[1], Reduction::Mean),
        &[x.clone(), y.clone()],
        m.named_parameters(),
        SGDConfig::new(0.01),
        &CompileOptions::default(),
    )?;
    let f = step.compiled();
    println!("{}", f.schedule());
    let mut args = vec![x.clone(), y.clone()];
    args.extend(m.parameters());
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let (_o, t) = f.call_timed(&args)?;
        println!("total {:?}", t0.elapsed());
        for (i, d) in t.0.iter().enumerate() {
            println!("  step {i} {} {:?}", f.steps()[i].name, d);
        }
    }
    Ok(())
}
