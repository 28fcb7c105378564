//! A client's DNS resolver as seen from several sites over paths of different lengths: each
//! query is answered (the same bytes with the response bit set) after the delay set for the
//! address it came from, so two instances probing it from their own source addresses measure
//! different RTTs on one loopback. Delays can change while it runs (the paths "swap").

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::task::JoinHandle;

pub struct DelayedResolver {
    pub addr: SocketAddr,
    delays: Arc<Mutex<HashMap<IpAddr, Duration>>>,
    queries: Arc<Mutex<BTreeMap<IpAddr, u64>>>,
    task: JoinHandle<()>,
}

impl Drop for DelayedResolver {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl DelayedResolver {
    pub async fn start(addr: SocketAddr) -> io::Result<DelayedResolver> {
        let socket = Arc::new(crate::bind_udp(addr).await?);
        let addr = socket.local_addr()?;
        let delays: Arc<Mutex<HashMap<IpAddr, Duration>>> = Arc::default();
        let queries: Arc<Mutex<BTreeMap<IpAddr, u64>>> = Arc::default();
        let (d, q) = (delays.clone(), queries.clone());
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                if n < 12 {
                    continue;
                }
                if let Ok(mut q) = q.lock() {
                    *q.entry(from.ip()).or_insert(0) += 1;
                }
                let delay = d
                    .lock()
                    .ok()
                    .and_then(|d| d.get(&from.ip()).copied())
                    .unwrap_or_default();
                let mut reply = buf[..n].to_vec();
                reply[2] |= 0x80;
                let socket = socket.clone();
                tokio::spawn(async move {
                    tokio::time::sleep(delay).await;
                    let _ = socket.send_to(&reply, from).await;
                });
            }
        });
        Ok(DelayedResolver {
            addr,
            delays,
            queries,
            task,
        })
    }

    /// Answers queries from `source` after `delay`.
    pub fn set_delay(&self, source: IpAddr, delay: Duration) {
        if let Ok(mut d) = self.delays.lock() {
            d.insert(source, delay);
        }
    }

    /// Queries received from `source`.
    pub fn queries_from(&self, source: IpAddr) -> u64 {
        self.queries
            .lock()
            .map(|q| q.get(&source).copied().unwrap_or(0))
            .unwrap_or(0)
    }

    /// Queries received in all.
    pub fn queries(&self) -> u64 {
        self.queries.lock().map(|q| q.values().sum()).unwrap_or(0)
    }
}
