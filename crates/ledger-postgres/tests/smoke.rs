//! tmp smoke
#[test]
fn smoke() {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let t = std::time::Instant::now();
    let server = stepguard_pgserver::PgServer::start(dir).unwrap();
    eprintln!("started in {:?}", t.elapsed());
    let mut c = postgres::Client::connect(&server.url(), postgres::NoTls).unwrap();
    let v: i32 = c.query_one("SELECT 1", &[]).unwrap().get(0);
    assert_eq!(v, 1);
    let bad = server.url().replace(server.password(), "wrong");
    let Err(e) = postgres::Client::connect(&bad, postgres::NoTls) else {
        panic!()
    };
    eprintln!("{e}");
    let t = std::time::Instant::now();
    drop(server);
    eprintln!("dropped in {:?}", t.elapsed());
}
