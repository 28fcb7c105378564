//! Acts on elastic pools' joins and leaves (decided by `fulcrum_balance::elastic`): logs each
//! one and runs the pool's `hook` with the event as JSON on stdin. Hooks run in their own task
//! with a timeout, so a slow or stuck script never delays the refresh loop or the data plane.

use std::process::Stdio;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use fulcrum_balance::{clock, ElasticEvent, Pool};
use tokio::io::AsyncWriteExt;

/// One evaluation of every elastic pool (called from the periodic pool refresh).
pub fn tick(pools: &[Arc<Pool>]) {
    let now = clock::now_ms();
    for pool in pools.iter().filter(|p| p.elastic.is_some()) {
        let Some(event) = pool.elastic_tick(now) else {
            continue;
        };
        tracing::info!(
            pool = %event.pool,
            member = %event.member,
            action = ?event.action,
            on = event.on,
            utilisation = format!("{:.3}", event.utilisation),
            threshold = event.threshold,
            joined = event.joined,
            standby = event.standby,
            "elastic pool changed"
        );
        if pool
            .elastic
            .as_ref()
            .is_some_and(|e| !e.config.hook.is_empty())
        {
            tokio::spawn(run_hook(pool.clone(), event));
        }
    }
}

async fn run_hook(pool: Arc<Pool>, event: ElasticEvent) {
    let Some(e) = pool.elastic.as_ref() else {
        return;
    };
    e.hook_runs.fetch_add(1, Ordering::Relaxed);
    let result = tokio::time::timeout(e.config.hook_timeout, hook(&e.config.hook, &event)).await;
    let failure = match result {
        Ok(Ok(())) => return,
        Ok(Err(err)) => err,
        Err(_) => format!("still running after {:?}; killed", e.config.hook_timeout),
    };
    e.hook_failures.fetch_add(1, Ordering::Relaxed);
    tracing::warn!(pool = %event.pool, member = %event.member, hook = %e.config.hook.join(" "), error = %failure, "elastic hook failed");
}

async fn hook(argv: &[String], event: &ElasticEvent) -> Result<(), String> {
    let (cmd, args) = argv.split_first().ok_or("no command")?;
    let mut child = tokio::process::Command::new(cmd)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {cmd}: {e}"))?;
    let mut json = serde_json::to_vec(event).map_err(|e| e.to_string())?;
    json.push(b'\n');
    if let Some(mut stdin) = child.stdin.take() {
        // A hook that ignores its stdin and exits early closes the pipe: not a failure.
        let _ = stdin.write_all(&json).await;
    }
    let status = child.wait().await.map_err(|e| e.to_string())?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("exited with {status}"))
    }
}
