//! `Envelope::parse` of arbitrary bytes: see
//! `ordo_testkit::fuzz::check_envelope_parse`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ordo_testkit::fuzz::check_envelope_parse(data));
