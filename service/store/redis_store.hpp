#pragma once
// The remote tier's client for a Redis-compatible store (Redis, Valkey, KeyDB; standalone
// or Redis Cluster), through hiredis (Debian's libhiredis-dev). hiredis is optional at
// build time: without it redis_available() is false and make_redis_store() throws.
//
// What a store does (store/redis_store.cpp; its nodes: store/redis_connection.cpp):
//   - At construction it asks the seeds CLUSTER SLOTS: an array makes it a cluster client
//     (slot map of the masters, one connection per node), an error such as "cluster
//     support disabled" a standalone client (one connection). Seeds that are all down do
//     not stop construction: the first call throws RemoteError and later calls find out.
//   - put is SET key value NX [PX ttl]: a key keeps its first value (RemoteStore).
//   - Each node has two blocking connections, each guarded by a mutex: one for lookups
//     (GET) and one for writes (SET, DEL), so that a lookup never waits behind a large
//     value being sent to the same node. Calls of one kind to one node are serialized;
//     the two kinds, and calls to different cluster nodes, run in parallel. A connection
//     that fails (I/O error, timeout, protocol error) is dropped and made again by a later
//     call, at most once per `timeout` per connection: in between, calls over it throw
//     RemoteError at once, so a dead Redis costs a fast failure, not a hang. A connection
//     the server closed while it was idle is made again at once, in the same call. A
//     connect that fails, or a connection the server closed, tells the node's other
//     connection too (it drops its own and makes no new one within `timeout` unless a
//     connect works meanwhile); a timeout does not (a slow write says nothing of lookups).
//     CLUSTER SLOTS goes over the connection of the call that needs the map.
//   - Cluster routing: slot = redis_key_slot(key). MOVED updates the slot, refreshes the
//     map (at most once per `timeout`) and retries on the named node; ASK sends ASKING and
//     the command to the named node. At most kMaxRedisRedirects redirects per call. A node
//     that is down makes only its slots fail; the map is refreshed then (a replica that
//     took over is found) and the call retried once if the slot moved.
//   - `timeout` bounds connecting and each socket read or write of a command (not the
//     whole transfer of a large value: a 150 MB value that keeps moving never times out).
//     Host names are resolved (getaddrinfo) at each connection, outside that bound: give
//     addresses where a slow resolver matters.
//   - Memory: a put briefly holds two copies of the value inside hiredis (the formatted
//     command and its output buffer), a get one copy in hiredis's reply and the returned
//     string; hiredis's read buffer is given back after each large reply. A node costs
//     the server two client connections per daemon. One SET is at
//     most 2 GiB (hiredis 0.14 counts a command's bytes in an int); Redis's own limit,
//     proto-max-bulk-len, is 512 MB unless configured.
//
// Thread-safety: parse_redis_url, redis_key_slot and redis_available are pure; a store
// from make_redis_store may be used from any number of threads at once (RemoteStore).

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "store/remote_store.hpp"

namespace statepool::service {

struct RedisEndpoint {
  std::string host;  ///< name, IPv4 or IPv6 address (without brackets)
  std::uint16_t port = 6379;
  friend bool operator==(const RedisEndpoint&, const RedisEndpoint&) = default;
};

struct RedisOptions {
  std::vector<RedisEndpoint> seeds;        ///< one node, or any nodes of a cluster
  std::chrono::milliseconds timeout{250};  ///< connect and each command
  std::chrono::seconds ttl{0};             ///< 0 = no expiry
  std::string password;                    ///< AUTH when not empty
};

/// Number of hash slots of a Redis Cluster.
inline constexpr std::uint16_t kRedisClusterSlots = 16384;
/// MOVED / ASK redirects one call follows before it gives up with RemoteError.
inline constexpr int kMaxRedisRedirects = 2;

/// Parses "redis://host:port[,host:port...]" (also "redis://:password@host:port,host2:port2";
/// IPv6 "[::1]:6379"; default port 6379; an optional "/0" path). The password is
/// percent-decoded; a user name other than "default" (Redis 6 ACL users), another database
/// than 0, "rediss://" (TLS) and query parameters are refused. Throws std::invalid_argument
/// naming what is wrong (the password itself is never in the message). timeout, ttl: the
/// defaults.
RedisOptions parse_redis_url(std::string_view url);

/// "127.0.0.1:6379", "[::1]:6379": how messages and describe() name a node.
[[nodiscard]] std::string to_string(const RedisEndpoint& endpoint);

/// The Redis Cluster hash slot of `key`: CRC16-XMODEM of the key, or of its hash tag (the
/// bytes between the first '{' and the next '}' when there are any), mod 16384.
[[nodiscard]] std::uint16_t redis_key_slot(std::string_view key) noexcept;

/// CRC16-XMODEM (polynomial 0x1021, initial value 0), as the Redis Cluster spec defines
/// it ("123456789" -> 0x31C3).
[[nodiscard]] std::uint16_t redis_crc16(std::string_view bytes) noexcept;

/// Whether this build has the Redis client (hiredis was found when it was configured).
[[nodiscard]] bool redis_available() noexcept;

/// Connects to the seeds at once to learn whether it is a cluster (CLUSTER SLOTS; a
/// standalone server answers an error -> standalone), but a store whose servers are all
/// down still constructs: the first call then throws RemoteError and later calls retry the
/// connection, at most once per `timeout` per node. Throws std::invalid_argument for
/// options without seeds, a timeout that is not positive or a negative ttl, and
/// RemoteError when this build has no hiredis.
std::unique_ptr<RemoteStore> make_redis_store(RedisOptions options);

}  // namespace statepool::service
