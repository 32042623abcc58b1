//! cronoq: a label-aware task scheduler for fleets of workers that differ.
//!
//! See `README.md` for a tour and `ARCHITECTURE.md` for the map.

pub mod core;
