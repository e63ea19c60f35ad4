#include "daemon/offload.h"

#include <utility>  // before Asio: its awaitable.hpp uses std::exchange
#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

namespace towers::daemon {

struct Offload::Impl {
  boost::asio::thread_pool pool{1};
};

Offload::Offload() : impl_(std::make_unique<Impl>()) {}

Offload::~Offload() { impl_->pool.join(); }

void Offload::post(std::function<void()> job) { boost::asio::post(impl_->pool, std::move(job)); }

}  // namespace towers::daemon
