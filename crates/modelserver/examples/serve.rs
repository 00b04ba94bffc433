//! Runs a scripted model server by hand, to point an agent CLI at it and watch its requests:
//! `cargo run -p stepguard-modelserver --example serve -- ROUNDS [429|500|broken FROM_ROUND]`.
#![allow(clippy::print_stdout, clippy::unwrap_used)]

use stepguard_modelserver::{Fault, FaultKind, ModelServer, Script};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds = args.first().and_then(|a| a.parse().ok()).unwrap_or(3);
    let mut script = Script::tool_rounds(rounds);
    if let (Some(kind), Some(from)) = (args.get(1), args.get(2).and_then(|a| a.parse().ok())) {
        let kind = match kind.as_str() {
            "429" => FaultKind::RateLimited {
                retry_after_secs: 1,
            },
            "500" => FaultKind::ServerError,
            _ => FaultKind::BrokenStream,
        };
        script = script.fault(Fault::persistent(from, kind));
    }
    let server = ModelServer::start(script).unwrap();
    println!("{}", server.url());
    let mut seen = 0;
    loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        for r in server.requests().into_iter().skip(seen) {
            seen += 1;
            println!(
                "#{} {} {} api={:?} stream={} tools={} disabled={} notices={} results={} -> {:?}",
                r.seq,
                r.method,
                r.target,
                r.api,
                r.stream,
                r.tools.len(),
                r.tools_disabled,
                r.notices,
                r.tool_results,
                r.reply
            );
        }
    }
}
