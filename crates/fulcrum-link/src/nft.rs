//! Applies nftables text in one transaction, from a netlink socket this process owns.
//!
//! nftables is programmed with its native syntax through libnftables, the library the `nft`
//! tool itself is (loaded at run time: the nftables package depends on it, so every system
//! with `nft` has it). Why not a crate: the kernel's interface is nf_tables netlink, whose
//! message format is private to libnftnl and changes with kernel features; no maintained Rust
//! crate speaks it, and the `nftables` crate drives the `nft` binary, which cannot do the
//! next point. Why in-process rather than `nft -f`: the table is created with `flags owner`,
//! which ties it to the netlink socket that created it. The kernel deletes an owned table when
//! that socket closes, and the socket closes however this process ends (kill -9 and the OOM
//! killer included), so a dead Fulcrum never leaves the LAN's DNS redirected to a proxy that
//! is gone, or its flows marked for routes nobody maintains. An owned table can be read by
//! anyone (`nft list`) but changed only through its owner. One run is one atomic transaction:
//! the table is replaced whole or not at all, and a failure leaves the previous one working.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::process::{Command, Stdio};
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::plan::TABLE;

/// The libnftables(3) functions used (a stable C API: soname libnftables.so.1).
struct Lib {
    ctx_new: unsafe extern "C" fn(u32) -> *mut c_void,
    ctx_free: unsafe extern "C" fn(*mut c_void),
    buffer_output: unsafe extern "C" fn(*mut c_void) -> c_int,
    buffer_error: unsafe extern "C" fn(*mut c_void) -> c_int,
    get_output: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    get_error: unsafe extern "C" fn(*mut c_void) -> *const c_char,
    run: unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int,
}

fn lib() -> Result<&'static Lib, String> {
    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();
    LIB.get_or_init(load).as_ref().map_err(Clone::clone)
}

fn load() -> Result<Lib, String> {
    // SAFETY: dlopen with a NUL-terminated literal; the handle is never closed, so the symbols
    // stay valid for the life of the process.
    let handle = unsafe { libc::dlopen(c"libnftables.so.1".as_ptr(), libc::RTLD_NOW) };
    if handle.is_null() {
        return Err(
            "cannot load libnftables.so.1 (package libnftables1, which nftables depends on)".into(),
        );
    }
    let sym = |name: &CStr| -> Result<*mut c_void, String> {
        // SAFETY: `handle` is a live dlopen handle and `name` is NUL-terminated.
        let p = unsafe { libc::dlsym(handle, name.as_ptr()) };
        if p.is_null() {
            Err(format!("libnftables.so.1 has no {name:?}"))
        } else {
            Ok(p)
        }
    };
    // SAFETY (each transmute): the symbol is the libnftables(3) function of that name, whose C
    // prototype the field's type mirrors (struct nft_ctx * as an opaque pointer, uint32_t as
    // u32, int as c_int, const char * as *const c_char); function and data pointers have the
    // same size on Linux.
    unsafe {
        Ok(Lib {
            ctx_new: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(u32) -> *mut c_void>(
                sym(c"nft_ctx_new")?,
            ),
            ctx_free: std::mem::transmute::<*mut c_void, unsafe extern "C" fn(*mut c_void)>(sym(
                c"nft_ctx_free",
            )?),
            buffer_output: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void) -> c_int,
            >(sym(c"nft_ctx_buffer_output")?),
            buffer_error: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void) -> c_int,
            >(sym(c"nft_ctx_buffer_error")?),
            get_output: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void) -> *const c_char,
            >(sym(c"nft_ctx_get_output_buffer")?),
            get_error: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void) -> *const c_char,
            >(sym(c"nft_ctx_get_error_buffer")?),
            run: std::mem::transmute::<
                *mut c_void,
                unsafe extern "C" fn(*mut c_void, *const c_char) -> c_int,
            >(sym(c"nft_run_cmd_from_buffer")?),
        })
    }
}

/// A libnftables context: its netlink socket owns Fulcrum's table while the process lives.
pub struct Session {
    lib: &'static Lib,
    ctx: NonNull<c_void>,
    /// The `inet` table this session owns (`fulcrum_link`, or the transparency table).
    table: &'static str,
    /// The table exists and was created by this session (so it carries `flags owner`).
    owns_table: bool,
}

// SAFETY: a libnftables context has no affinity to the thread that created it (no
// thread-local state); `Session` gives access to it only through `&mut self`, so one thread at
// a time uses it.
unsafe impl Send for Session {}

impl Session {
    pub fn open() -> Result<Session, String> {
        Session::open_for(TABLE)
    }

    /// A session owning the `inet` table `table`.
    pub fn open_for(table: &'static str) -> Result<Session, String> {
        let lib = lib()?;
        // SAFETY: nft_ctx_new(NFT_CTX_DEFAULT) has no preconditions; null means failure.
        let ctx = NonNull::new(unsafe { (lib.ctx_new)(0) })
            .ok_or("libnftables: cannot create a context (netlink socket)")?;
        // From here `Drop` frees the context.
        let session = Session {
            lib,
            ctx,
            table,
            owns_table: false,
        };
        // libmnl opens the netlink socket without close-on-exec: a child (nft, conntrack, a
        // hook) would keep it, and with it the table, open after this process died.
        close_netfilter_sockets_on_exec();
        // SAFETY: a valid context; buffering keeps libnftables off this process's stdout and
        // stderr, and makes the messages readable below.
        unsafe {
            (lib.buffer_output)(ctx.as_ptr());
            (lib.buffer_error)(ctx.as_ptr());
        }
        Ok(session)
    }

    /// Runs `script` as one transaction; the error carries nft's message.
    pub fn run(&mut self, script: &str) -> Result<(), String> {
        let text = CString::new(script).map_err(|_| "a NUL byte in the ruleset".to_string())?;
        let ctx = self.ctx.as_ptr();
        // SAFETY: a valid context and a NUL-terminated buffer that outlives the call. The
        // buffers libnftables returns stay valid until the next call on the context and are
        // copied before it.
        let (rc, error) = unsafe {
            let rc = (self.lib.run)(ctx, text.as_ptr());
            // Read (and so reset) both buffers: they would grow with every run otherwise.
            let _ = (self.lib.get_output)(ctx);
            let e = (self.lib.get_error)(ctx);
            let error = if e.is_null() {
                String::new()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            };
            (rc, error)
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(format!("nft refused the ruleset: {}", error.trim()))
        }
    }

    /// The commands that delete Fulcrum's table, whether or not it exists: the owned table
    /// directly; otherwise `table` first, so the delete cannot fail on a missing table. (Not on
    /// an owned table: declaring it without `flags owner` would try to clear the flag.)
    fn delete_script(&self) -> String {
        let table = self.table;
        if self.owns_table {
            format!("delete table inet {table}\n")
        } else {
            format!("table inet {table}\ndelete table inet {table}\n")
        }
    }

    /// Replaces Fulcrum's table with `table` (its whole text, with `flags owner`). The first
    /// time, a table of the same name left by an earlier run that did not own it goes in the
    /// same transaction; one owned by another live process is refused (not permitted).
    pub fn replace_table(&mut self, table: &str) -> Result<(), String> {
        self.run(&format!("{}{table}", self.delete_script()))?;
        self.owns_table = true;
        Ok(())
    }

    /// Removes the table (shutdown).
    pub fn remove_table(&mut self) -> Result<(), String> {
        let r = self.run(&self.delete_script());
        if r.is_ok() {
            self.owns_table = false;
        }
        r
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        // SAFETY: the context is valid and not used after this; freeing it closes the socket,
        // and the kernel deletes the table it owns.
        unsafe { (self.lib.ctx_free)(self.ctx.as_ptr()) }
    }
}

/// Sets close-on-exec on every netfilter netlink socket of this process that lacks it.
fn close_netfilter_sockets_on_exec() {
    let Ok(dir) = std::fs::read_dir("/proc/self/fd") else {
        return;
    };
    for entry in dir.flatten() {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<c_int>().ok())
        else {
            continue;
        };
        let int_opt = |opt: c_int| -> Option<c_int> {
            let mut v: c_int = 0;
            let mut len = std::mem::size_of::<c_int>() as libc::socklen_t;
            // SAFETY: getsockopt writes at most `len` bytes into the local `v`; on a descriptor
            // that is not a socket (or closed meanwhile) it fails without touching memory.
            let rc = unsafe {
                libc::getsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    opt,
                    (&mut v as *mut c_int).cast(),
                    &mut len,
                )
            };
            (rc == 0).then_some(v)
        };
        if int_opt(libc::SO_DOMAIN) != Some(libc::AF_NETLINK)
            || int_opt(libc::SO_PROTOCOL) != Some(libc::NETLINK_NETFILTER)
        {
            continue;
        }
        // SAFETY: F_GETFD / F_SETFD only read and set the descriptor's flags; no memory is
        // passed.
        unsafe {
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 && flags & libc::FD_CLOEXEC == 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// Reads the packet counters of the named counters in Fulcrum's table: `(name, packets)`.
pub fn counters(table: &str) -> Vec<(String, u64)> {
    let Ok(out) = Command::new("nft")
        .args(["-j", "list", "counters", "table", "inet", table])
        .stderr(Stdio::null())
        .output()
    else {
        return Vec::new();
    };
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(&out.stdout) else {
        return Vec::new();
    };
    v["nftables"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|it| {
                    let c = it.get("counter")?;
                    Some((c["name"].as_str()?.to_string(), c["packets"].as_u64()?))
                })
                .collect()
        })
        .unwrap_or_default()
}
