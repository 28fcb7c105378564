//! Network namespaces for tests that need hosts of their own (XDP, links, gateways, HA): a `Lab`
//! creates namespaces and veth pairs under a per-process prefix and removes all of it when it is
//! dropped, also when the test panics, so a failed run leaves nothing behind on the machine.
//!
//! Traffic in these tests only ever goes to addresses inside the lab's namespaces. Interface
//! names live inside their namespaces (veths are created there directly), so two tests — or two
//! test processes — never collide on a name; namespace names carry the tag and the process id.

use std::process::{Child, Command, Output, Stdio};

/// A set of namespaces owned by one test; dropping it kills the processes it spawned and deletes
/// the namespaces (and with them every interface inside).
pub struct Lab {
    prefix: String,
    namespaces: Vec<String>,
    children: Vec<Child>,
}

/// One namespace of a `Lab`.
#[derive(Clone, Debug)]
pub struct Ns {
    pub name: String,
}

/// Runs a command and returns its output, or a message with the command line and its stderr.
pub fn run(program: &str, args: &[&str]) -> Result<Output, String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| format!("{program}: {e}"))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(format!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Lab {
    /// `tag`: a few letters naming the test file, so a leftover (after a kill -9) says whose it is.
    /// Leftovers of labs whose process is gone are removed first (see `remove_orphans`).
    pub fn new(tag: &str) -> Lab {
        remove_orphans();
        Lab {
            prefix: format!("fl-{tag}-{}", std::process::id()),
            namespaces: Vec::new(),
            children: Vec::new(),
        }
    }

    /// A new namespace with `lo` up.
    pub fn ns(&mut self, name: &str) -> Result<Ns, String> {
        let full = format!("{}-{name}", self.prefix);
        run("ip", &["netns", "add", &full])?;
        self.namespaces.push(full.clone());
        let ns = Ns { name: full };
        ns.ip(&["link", "set", "lo", "up"])?;
        Ok(ns)
    }

    /// A veth pair between two namespaces, both ends up.
    pub fn veth(&self, a: &Ns, a_if: &str, b: &Ns, b_if: &str) -> Result<(), String> {
        run(
            "ip",
            &[
                "link", "add", "name", a_if, "netns", &a.name, "type", "veth", "peer", "name",
                b_if, "netns", &b.name,
            ],
        )?;
        a.ip(&["link", "set", a_if, "up"])?;
        b.ip(&["link", "set", b_if, "up"])?;
        Ok(())
    }

    /// Starts `program` inside `ns`; the lab kills it when dropped (or earlier through `kill`).
    /// Returns the index to pass to `kill`.
    pub fn spawn(&mut self, ns: &Ns, program: &str, args: &[&str]) -> Result<usize, String> {
        let child = ns
            .command(program, args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("{program} in {}: {e}", ns.name))?;
        self.children.push(child);
        Ok(self.children.len() - 1)
    }

    /// Keeps a child started elsewhere (e.g. with its output captured) to kill it on drop.
    pub fn adopt(&mut self, child: Child) -> usize {
        self.children.push(child);
        self.children.len() - 1
    }

    /// Kills a spawned process now (SIGKILL) and waits for it.
    pub fn kill(&mut self, index: usize) {
        if let Some(child) = self.children.get_mut(index) {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The process id of a spawned process.
    pub fn pid(&self, index: usize) -> Option<u32> {
        self.children.get(index).map(Child::id)
    }
}

/// Deletes the namespaces of labs whose test process no longer exists: a process killed from
/// outside (a timeout, SIGKILL) never runs `Drop`, and its namespaces (with their nftables
/// tables and XDP programs) would stay on the machine. Names are `fl-{tag}-{pid}-{name}`; the
/// first all-digit part is the owner's process id. A live process id is left alone, even when
/// reused by another process: removing a running test's lab is worse than keeping a leftover.
fn remove_orphans() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if lab_owner(&name)
            .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
        {
            let _ = Command::new("ip").args(["netns", "del", &name]).output();
        }
    }
}

/// The process id in a lab's namespace name, `None` for any other name.
fn lab_owner(name: &str) -> Option<u32> {
    let rest = name.strip_prefix("fl-")?;
    let mut parts = rest.split('-');
    parts.next()?; // the tag's first part: never the process id
    parts
        .find(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))?
        .parse()
        .ok()
}

impl Drop for Lab {
    fn drop(&mut self) {
        for child in &mut self.children {
            let _ = child.kill();
            let _ = child.wait();
        }
        for ns in self.namespaces.iter().rev() {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

impl Ns {
    /// `ip -n NS ARGS…`
    pub fn ip(&self, args: &[&str]) -> Result<Output, String> {
        let mut full = vec!["-n", &self.name];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Adds `cidr` (e.g. "198.18.1.1/24") to `ifname`.
    pub fn addr(&self, ifname: &str, cidr: &str) -> Result<(), String> {
        let family = if cidr.contains(':') { "-6" } else { "-4" };
        let mut args = vec![family, "-n", self.name.as_str()];
        args.extend_from_slice(&["addr", "add", cidr, "dev", ifname]);
        if cidr.contains(':') {
            args.push("nodad");
        }
        run("ip", &args).map(drop)
    }

    /// `ip route add ROUTE…` in the namespace (e.g. `["default", "via", "198.18.1.1"]`).
    pub fn route(&self, route: &[&str]) -> Result<(), String> {
        let mut args = vec!["route", "add"];
        args.extend_from_slice(route);
        self.ip(&args).map(drop)
    }

    pub fn sysctl(&self, key: &str, value: &str) -> Result<(), String> {
        self.exec("sysctl", &["-qw", &format!("{key}={value}")])
            .map(drop)
    }

    /// A command that runs inside the namespace (`ip netns exec`), to configure before spawning.
    pub fn command(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]).args(args);
        cmd
    }

    /// Moves the calling thread into the namespace (`setns`): sockets it opens and processes it
    /// starts from then on live there (a test gives this its own thread and runtime, so it can
    /// run the binary, members and clients inside and still talk to them). The thread stays in
    /// the namespace until it ends.
    pub fn enter_current_thread(&self) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let path = format!("/var/run/netns/{}", self.name);
        let f = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        // SAFETY: `f` is an open namespace file for the duration of the call; setns only changes
        // the calling thread's network namespace.
        let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("setns {path}: {}", std::io::Error::last_os_error()))
        }
    }

    /// Runs a command inside the namespace to completion; an error carries its stderr.
    pub fn exec(&self, program: &str, args: &[&str]) -> Result<Output, String> {
        let mut full = vec!["netns", "exec", self.name.as_str(), program];
        full.extend_from_slice(args);
        run("ip", &full)
    }

    /// Runs `f` on a new thread that has entered the namespace: sockets it opens live there,
    /// so a test's own servers and clients can sit in its namespaces without helper binaries.
    /// Only the new thread moves; the test process stays where it was.
    pub fn thread<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<Result<T, String>> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
            // SAFETY: setns(2) on a namespace file descriptor we hold open; it changes only the
            // calling thread's network namespace and touches no memory of ours.
            let rc =
                unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
            if rc != 0 {
                return Err(format!("setns {path}: {}", std::io::Error::last_os_error()));
            }
            Ok(f())
        })
    }

    /// The kernel's counters of an interface: (rx_packets, tx_packets).
    pub fn link_packets(&self, ifname: &str) -> Result<(u64, u64), String> {
        let read = |dir: &str| -> Result<u64, String> {
            let out = self.exec(
                "cat",
                &[&format!("/sys/class/net/{ifname}/statistics/{dir}_packets")],
            )?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse()
                .map_err(|e| format!("{ifname} {dir}_packets: {e}"))
        };
        Ok((read("rx")?, read("tx")?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_namespaces_ping_each_other_and_vanish_after_drop() {
        let names;
        {
            let mut lab = Lab::new("tk");
            let a = lab.ns("a").expect("namespace a");
            let b = lab.ns("b").expect("namespace b");
            lab.veth(&a, "eth0", &b, "eth0").expect("veth");
            a.addr("eth0", "198.18.0.1/30").expect("address a");
            b.addr("eth0", "198.18.0.2/30").expect("address b");
            a.exec("ping", &["-c", "1", "-W", "2", "198.18.0.2"])
                .expect("ping across the veth");
            let (rx, tx) = b.link_packets("eth0").expect("counters");
            assert!(rx >= 1 && tx >= 1, "rx {rx} tx {tx}");
            names = vec![a.name.clone(), b.name.clone()];
        }
        let list = run("ip", &["netns", "list"]).expect("ip netns list");
        let list = String::from_utf8_lossy(&list.stdout);
        for n in names {
            assert!(!list.contains(&n), "{n} left behind: {list}");
        }
    }

    #[test]
    fn lab_owner_is_the_process_id_in_a_lab_name() {
        assert_eq!(lab_owner("fl-sand6-8110-gw3"), Some(8110));
        assert_eq!(lab_owner("fl-ha-77-node-a"), Some(77));
        assert_eq!(lab_owner("fl-xdp-lb"), None);
        assert_eq!(lab_owner("blue"), None);
        assert_eq!(lab_owner("bl123-lan"), None);
    }

    #[test]
    fn a_new_lab_removes_the_namespaces_of_a_killed_process_and_keeps_a_live_ones() {
        // A process id no process has: the lab of a test process killed before its drop.
        let dead = (1_000_000..4_000_000)
            .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
            .expect("a free process id");
        let orphan = format!("fl-orphan-{dead}-a");
        let alive = format!("fl-orphan-{}-b", std::process::id());
        run("ip", &["netns", "add", &orphan]).expect("orphan namespace");
        run("ip", &["netns", "add", &alive]).expect("live namespace");
        let _lab = Lab::new("tk2");
        let list = run("ip", &["netns", "list"]).expect("ip netns list");
        let list = String::from_utf8_lossy(&list.stdout).into_owned();
        let _ = run("ip", &["netns", "del", &alive]);
        let _ = run("ip", &["netns", "del", &orphan]);
        assert!(!list.contains(&orphan), "{orphan} left behind: {list}");
        assert!(
            list.contains(&alive),
            "{alive} of a live process removed: {list}"
        );
    }
}
