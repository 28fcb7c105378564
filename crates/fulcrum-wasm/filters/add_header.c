/*
 * A proxy-wasm filter in C without a libc: adds `x-filter: <plugin configuration>` to every
 * request and removes `x-internal`; answers 403 itself when the request carries `x-deny`.
 * Built by build.sh with Debian's clang and wasm-ld; the .wasm beside it is what the tests load.
 */
typedef unsigned int u32;
typedef unsigned char u8;

#define IMPORT(name) __attribute__((import_module("env"), import_name(#name)))
#define EXPORT(name) __attribute__((export_name(#name)))

IMPORT(proxy_get_buffer_bytes)
u32 proxy_get_buffer_bytes(u32 type, u32 start, u32 max, u8 **data, u32 *size);
IMPORT(proxy_get_header_map_value)
u32 proxy_get_header_map_value(u32 map, const char *key, u32 key_size, u8 **value, u32 *size);
IMPORT(proxy_add_header_map_value)
u32 proxy_add_header_map_value(u32 map, const char *key, u32 key_size, const u8 *value, u32 size);
IMPORT(proxy_remove_header_map_value)
u32 proxy_remove_header_map_value(u32 map, const char *key, u32 key_size);
IMPORT(proxy_send_local_response)
u32 proxy_send_local_response(u32 status, const char *details, u32 details_size, const char *body,
                              u32 body_size, const u8 *headers, u32 headers_size, int grpc);

enum { REQUEST_HEADERS = 0, PLUGIN_CONFIGURATION = 7, CONTINUE = 0, PAUSE = 1 };

/* A bump allocator over a static arena: the host allocates here for every value it hands over,
 * and a filter that lives per request never needs to free. The arena restarts at each request. */
static u8 arena[64 * 1024];
static u32 used;

EXPORT(proxy_on_memory_allocate) void *proxy_on_memory_allocate(u32 size) {
  u32 at = (used + 7) & ~7u;
  if (size > sizeof(arena) || at > sizeof(arena) - size) return 0;
  used = at + size;
  return arena + at;
}

static u8 config[256];
static u32 config_size;

EXPORT(proxy_abi_version_0_2_1) void proxy_abi_version_0_2_1(void) {}
EXPORT(proxy_on_context_create) void proxy_on_context_create(u32 id, u32 parent) {}

EXPORT(proxy_on_configure) u32 proxy_on_configure(u32 root, u32 size) {
  u8 *data = 0;
  u32 n = 0;
  if (size && proxy_get_buffer_bytes(PLUGIN_CONFIGURATION, 0, size, &data, &n) == 0) {
    config_size = n < sizeof(config) ? n : sizeof(config);
    for (u32 i = 0; i < config_size; i++) config[i] = data[i];
  }
  used = 0;
  return 1;
}

EXPORT(proxy_on_request_headers) u32 proxy_on_request_headers(u32 ctx, u32 headers, u32 eos) {
  u8 *value = 0;
  u32 n = 0;
  used = 0;
  if (proxy_get_header_map_value(REQUEST_HEADERS, "x-deny", 6, &value, &n) == 0) {
    proxy_send_local_response(403, "denied", 6, "denied by filter\n", 17, 0, 0, -1);
    return PAUSE;
  }
  proxy_remove_header_map_value(REQUEST_HEADERS, "x-internal", 10);
  proxy_add_header_map_value(REQUEST_HEADERS, "x-filter", 8, config, config_size);
  return CONTINUE;
}
