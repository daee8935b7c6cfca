//! `Envelope::from_stored` of arbitrary text: see
//! `ordo_testkit::fuzz::check_stored_body`.

#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| ordo_testkit::fuzz::check_stored_body(data));
