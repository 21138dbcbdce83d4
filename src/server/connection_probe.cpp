#include "server/connection_probe.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>

namespace qvl::server {
namespace {

// "ip", port of a socket address (IPv4, IPv6; v4-mapped IPv6 shown as IPv4 like httplib does).
bool address_of(const sockaddr_storage& ss, std::string* ip, int* port) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (ss.ss_family == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&ss);
    if (!inet_ntop(AF_INET, &a->sin_addr, buf, sizeof buf)) return false;
    *port = ntohs(a->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&ss);
    if (IN6_IS_ADDR_V4MAPPED(&a->sin6_addr)) {
      if (!inet_ntop(AF_INET, &a->sin6_addr.s6_addr[12], buf, sizeof buf)) return false;
    } else if (!inet_ntop(AF_INET6, &a->sin6_addr, buf, sizeof buf)) {
      return false;
    }
    *port = ntohs(a->sin6_port);
  } else {
    return false;
  }
  *ip = buf;
  return true;
}

bool matches(int fd, const std::string& local_addr, int local_port, const std::string& remote_addr, int remote_port) {
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) return false;
  sockaddr_storage ss{};
  socklen_t len = sizeof ss;
  std::string ip;
  int port = -1;
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || !address_of(ss, &ip, &port)) return false;
  if (port != remote_port || ip != remote_addr) return false;
  len = sizeof ss;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0 || !address_of(ss, &ip, &port)) return false;
  return port == local_port && (local_addr.empty() || ip == local_addr);
}

}  // namespace

ConnectionProbe ConnectionProbe::find(const std::string& local_addr, int local_port, const std::string& remote_addr,
                                      int remote_port) {
  if (local_port <= 0 || remote_port <= 0) return ConnectionProbe();
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return ConnectionProbe();
  int found = -1;
  while (dirent* entry = readdir(dir)) {
    char* end = nullptr;
    long fd = std::strtol(entry->d_name, &end, 10);
    if (end == entry->d_name || *end != '\0' || fd == dirfd(dir)) continue;
    if (matches(static_cast<int>(fd), local_addr, local_port, remote_addr, remote_port)) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return ConnectionProbe(found);
}

bool ConnectionProbe::peer_closed() const {
  if (fd_ < 0) return false;
  pollfd p{fd_, POLLRDHUP, 0};
  if (poll(&p, 1, 0) <= 0) return false;
  return (p.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL)) != 0;
}

}  // namespace qvl::server
