//! `old-host PLUGIN STREAM`: what a stepguard host of the ABI freeze does with a plugin file:
//! load it (ABI generation, layout and protocol checks), open a counter for its default unit,
//! feed the stream in one chunk, and print `steps N` (exit 0), or the refusal (exit 4).

use std::process::ExitCode;

use stepguard_plugin_api::abi::HostCallbacks;
use stepguard_plugin_api::abi_stable_rstr::RStr;
use stepguard_plugin_api::host;

extern "C" fn log(_level: u8, _target: RStr<'_>, _message: RStr<'_>) {}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(plugin), Some(stream)) = (args.get(1), args.get(2)) else {
        eprintln!("usage: old-host PLUGIN STREAM");
        return ExitCode::from(2);
    };
    let callbacks = HostCallbacks { log, max_level: 0 };
    let provider = match host::load_file(std::path::Path::new(plugin), callbacks) {
        Ok(p) => p,
        Err(e) => {
            println!("refused: {e}");
            return ExitCode::from(4);
        }
    };
    let manifest = provider.manifest().clone();
    let unit = manifest.default_unit().unwrap_or_default().to_owned();
    let request = stepguard_plugin_api::CounterRequest {
        unit,
        ..Default::default()
    };
    let bytes = std::fs::read(stream).expect("read the stream");
    let result = provider.open_counter(&request).and_then(|mut counter| {
        let chunk = counter.feed_chunk(&bytes, u64::MAX)?;
        let stats = counter.finish()?;
        Ok((chunk, stats))
    });
    match result {
        Ok((chunk, stats)) => {
            println!(
                "{} {} steps {} finish {}",
                manifest.name, manifest.protocol, chunk.sum.steps_begun, stats.num_steps_computed
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("failed: {e}");
            ExitCode::from(4)
        }
    }
}
