use tch::{nn, nn::Module, nn::OptimizerConfig, Device, Kind, Tensor};
use tch_memprof::probe::*;
fn main() {
    let s0 = device_stats(0).unwrap();
    let t = Tensor::zeros([1000], (Kind::Float, Device::Cpu));
    let s1 = device_stats(0).unwrap();
    println!("zeros 1000 f32: delta {}", s1.live - s0.live);
    drop(t);
    let s2 = device_stats(0).unwrap();
    println!("after drop: delta {}", s2.live - s0.live);
    let vs = nn::VarStore::new(Device::Cpu);
    let net = nn::seq().add(nn::linear(vs.root() / "l1", 1024, 4096, Default::default())).add_fn(|x| x.relu()).add(nn::linear(vs.root() / "l2", 4096, 10, Default::default()));
    let mut opt = nn::Adam::default().build(&vs, 1e-3).unwrap();
    start(false).unwrap();
    for it in 0..3 {
        let x = Tensor::randn([256, 1024], (Kind::Float, Device::Cpu));
        let y = Tensor::zeros([256], (Kind::Int64, Device::Cpu));
        let loss = net.forward(&x).cross_entropy_for_logits(&y);
        let st = state(); println!("before backward: {:?}", st);
        opt.zero_grad();
        loss.backward();
        let st = state(); println!("after backward: {:?}", st);
        opt.step();
        let st = state(); println!("after step: {:?}", st);
        let d = device_stats(0).unwrap();
        println!("it {it}: {:?}", d);
        let mut log = Vec::new(); let _ = read_log(&mut log); for e in &log { println!("   ev {:?}", e); }
        let of = read_log(&mut log);
        println!("log {} overflow {}", log.len(), of);
        for (name, t) in vs.variables() { let b = tensor_block(&t, false).unwrap(); let g = tensor_block(&t, true).unwrap(); println!("  {name}: {:?} grad {:?}", b, g); }
        begin_iteration().unwrap();
    }
    stop().unwrap();
}
#[allow(dead_code)]
fn unused() {}
