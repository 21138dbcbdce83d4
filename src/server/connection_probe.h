// Notices that an HTTP client has gone away while its request is still being generated.
//
// cpp-httplib (0.11, as Debian ships it) gives a handler neither the socket nor a "closed"
// flag, and a non-streamed response writes nothing until generation ends, so a disconnect would
// otherwise go unnoticed until then and the sequence would keep its slot and KV pages. The probe
// finds the connection's socket once, by its address pair (local and peer address and port,
// which identify a TCP connection uniquely), among the process's open descriptors, and then
// polls it for POLLRDHUP/POLLHUP/POLLERR without reading. The descriptor stays valid for the
// whole handler: httplib closes it only after the handler and the response are done, on the
// same thread. Linux-only (POLLRDHUP, /proc/self/fd), as is qvl.
#pragma once

#include <string>

namespace qvl::server {

class ConnectionProbe {
 public:
  ConnectionProbe() = default;
  // Looks up the socket whose local end is local_addr:local_port and whose peer is
  // remote_addr:remote_port. Not finding it leaves the probe invalid (peer_closed() is false).
  static ConnectionProbe find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                              int remote_port);
  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  // True once the peer has closed or reset the connection. Never blocks.
  bool peer_closed() const;

 private:
  explicit ConnectionProbe(int fd) : fd_(fd) {}
  int fd_ = -1;
};

}  // namespace qvl::server
