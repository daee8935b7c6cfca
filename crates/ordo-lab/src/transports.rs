//! The transports the lab runs end to end, in one list: the soak's
//! `--transport` takes their names, and the experiment's `transport` group
//! runs its crash scenarios over each of them that has a network hop. A new
//! transport is one more entry of [`TRANSPORTS`].

use std::net::SocketAddr;

use ordo_core::crash;

use crate::serve::{ServeSpec, Served};

/// One transport: how the relays reach the consumer.
#[derive(Debug, Clone, Copy)]
pub struct LabTransport {
    /// Its name, as `--transport` takes it and reports give it.
    pub name: &'static str,
    /// What it is, in one line without a final stop (the help of
    /// `--transport`).
    pub summary: &'static str,
    /// The server process between the relays and the consumer store, if
    /// any; without one, a relay opens the consumer store itself
    /// (`--consumer`) and delivers in its own process.
    pub hop: Option<Hop>,
}

/// A transport's network hop: a server role on the consumer store that
/// relay children are pointed at.
#[derive(Debug, Clone, Copy)]
pub struct Hop {
    /// The `ordo` command of the server role (`serve`).
    pub command: &'static str,
    /// The crash point at which the server role exits once its receive
    /// has committed, before it answers the relay.
    pub after_commit: &'static str,
    /// Starts the server role and waits until it names its address.
    start: fn(&ServeSpec<'_>) -> Result<Served, String>,
    /// The flags that point `ordo relay` (and the soak's relay worker) at
    /// a server role listening on an address.
    relay_flags: fn(SocketAddr) -> Vec<String>,
}

impl Hop {
    /// Starts the server role of `spec`.
    pub fn start(&self, spec: &ServeSpec<'_>) -> Result<Served, String> {
        (self.start)(spec)
    }

    /// The flags of a relay child posting to the server role at `addr`.
    pub fn relay_flags(&self, addr: SocketAddr) -> Vec<String> {
        (self.relay_flags)(addr)
    }
}

/// Every transport the lab runs, the default (`file`) first.
pub static TRANSPORTS: [LabTransport; 2] = [
    LabTransport {
        name: "file",
        summary: "The consumer file, opened by the relay",
        hop: None,
    },
    LabTransport {
        name: "http",
        summary: "HTTP to an `ordo serve` child process",
        hop: Some(Hop {
            command: "serve",
            after_commit: crash::SERVE_AFTER_COMMIT,
            start: crate::serve::start,
            relay_flags: |addr| vec!["--to".to_owned(), format!("http://{addr}")],
        }),
    },
];

/// The transport named `name`.
pub fn by_name(name: &str) -> Option<&'static LabTransport> {
    TRANSPORTS.iter().find(|t| t.name == name)
}

/// Every transport with a network hop, with its hop.
pub fn networked() -> impl Iterator<Item = (&'static LabTransport, &'static Hop)> {
    TRANSPORTS
        .iter()
        .filter_map(|t| t.hop.as_ref().map(|hop| (t, hop)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::experiment::{scenario_names, Backend};
    use crate::soak::{check_options, roles, Role, SoakOptions};

    /// The soak's defaults on SQLite, over `transport`.
    fn soak_over(transport: &'static LabTransport) -> SoakOptions {
        SoakOptions {
            exe: "ordo".into(),
            seconds: 1,
            flows: 1,
            seed: None,
            dir: None,
            faults: false,
            transport,
            producer_threads: 1,
            backend: Backend::Sqlite,
            relays: 1,
            appliers: 1,
            keep: false,
            topology: None,
        }
    }

    #[test]
    fn every_transport_runs_in_the_soak_and_every_hop_in_the_experiment() {
        let names = scenario_names();
        let group: Vec<&str> = names
            .iter()
            .filter(|(group, _)| *group == "transport")
            .map(|(_, name)| name.as_str())
            .collect();
        for transport in &TRANSPORTS {
            let options = soak_over(by_name(transport.name).expect("listed"));
            if let Err(e) = check_options(&options) {
                panic!("the soak refuses --transport {}: {e}", transport.name);
            }
            let servers = roles(&options).into_iter().filter(|r| r.0 == Role::Server);
            assert_eq!(
                servers.count(),
                usize::from(transport.hop.is_some()),
                "{}: one server role for a hop, none without",
                transport.name
            );
            let Some(hop) = transport.hop else { continue };
            for name in [
                format!("crash_{}", hop.after_commit.replace('.', "_")),
                format!("crash_relay_after_receive_over_{}", transport.name),
            ] {
                assert!(group.contains(&name.as_str()), "{name} not in {group:?}");
            }
        }
        // The names reports and documents have always used.
        for name in [
            "crash_serve_after_commit",
            "crash_relay_after_receive_over_http",
        ] {
            assert!(group.contains(&name), "{name} not in {group:?}");
        }
    }

    #[test]
    fn every_transport_is_found_by_its_name_once() {
        for transport in &TRANSPORTS {
            let found = by_name(transport.name).expect("listed");
            assert!(std::ptr::eq(found, transport), "{}", transport.name);
            let same = TRANSPORTS.iter().filter(|t| t.name == transport.name);
            assert_eq!(same.count(), 1, "{} listed twice", transport.name);
        }
        assert!(by_name("carrier-pigeon").is_none());
    }

    #[test]
    fn every_hop_names_a_crash_point_and_points_relays_at_its_address() {
        for (transport, hop) in networked() {
            assert!(
                crash::CRASH_POINTS.contains(&hop.after_commit),
                "{}: {} is no crash point",
                transport.name,
                hop.after_commit
            );
            let addr = SocketAddr::from(([127, 0, 0, 1], 4100));
            let flags = hop.relay_flags(addr);
            assert!(
                flags.iter().any(|f| f.contains("127.0.0.1:4100")),
                "{flags:?}"
            );
        }
        let http = by_name("http").and_then(|t| t.hop).expect("http has a hop");
        assert_eq!(
            http.relay_flags(SocketAddr::from(([127, 0, 0, 1], 4100))),
            ["--to", "http://127.0.0.1:4100"]
        );
    }
}
