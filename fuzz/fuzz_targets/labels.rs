//! `Labels::parse`, `Labels::insert_parsed` and `PoolName::new` on
//! arbitrary text. Property: no panic; what parses validates and prints
//! back to text that parses to the same set.
#![no_main]

use cronoq::core::{Labels, PoolName};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|text: &str| {
    if let Ok(labels) = Labels::parse(text) {
        assert!(labels.validate().is_ok());
        let again = Labels::parse(&labels.to_string()).expect("printed labels parse");
        assert_eq!(again, labels);
    }
    let mut labels = Labels::new();
    for item in text.split(['\n', ';']) {
        let _ = labels.insert_parsed(item);
    }
    let _ = labels.validate();
    let _ = labels.to_string();
    if let Ok(pool) = PoolName::new(text) {
        assert_eq!(pool.as_str(), text);
    }
});
