//! `cronoq::server::ServerConfig::parse` on arbitrary TOML text, then
//! `PoolSection::to_core` of each pool. Property: no panic.
#![no_main]

use cronoq::server::ServerConfig;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(config) = ServerConfig::parse(text) {
        for pool in &config.pools {
            let _ = pool.to_core();
        }
    }
});
