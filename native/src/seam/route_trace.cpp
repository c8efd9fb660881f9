#include "seam/route_trace.h"

#include <cerrno>
#include <cstring>

#include "bmoe/error.h"

namespace bmoe::detail {

RouteTrace::RouteTrace(const std::string & path) : path_(path) {
    file_ = std::fopen(path.c_str(), "w");
    if (file_ == nullptr) {
        throw Error("cannot write the route trace " + path + ": " + std::strerror(errno));
    }
    if (std::fputs("step,pos,layer,experts,predicted\n", file_) < 0) {
        std::fclose(file_);
        throw Error("cannot write the route trace " + path + ": " + std::strerror(errno));
    }
}

RouteTrace::~RouteTrace() {
    if (file_ != nullptr) {
        std::fclose(file_);
    }
}

void RouteTrace::begin_batch(int first_pos, int n_tokens) {
    first_pos_ = first_pos;
    n_tokens_ = n_tokens;
}

void RouteTrace::predicted(int layer, const std::vector<int> & experts) {
    guess_layer_ = layer;
    guess_.clear();
    for (size_t i = 0; i < experts.size(); ++i) {
        guess_ += (i > 0 ? " " : "") + std::to_string(experts[i]);
    }
}

void RouteTrace::record(int layer, const std::vector<int> & ids, int per_token) {
    if (per_token <= 0) {
        return;
    }
    const std::string guess = layer == guess_layer_ ? guess_ : std::string();
    guess_layer_ = -1;
    const size_t rows = ids.size() / static_cast<size_t>(per_token);
    // Fewer rows than tokens: the last layer, which computes only the batch's last tokens.
    const int skipped = n_tokens_ > static_cast<int>(rows) ? n_tokens_ - static_cast<int>(rows) : 0;
    for (size_t t = 0; t < rows; ++t) {
        line_ = std::to_string(step_) + "," + std::to_string(first_pos_ + skipped + static_cast<int>(t)) + "," +
                std::to_string(layer) + ",";
        for (int k = 0; k < per_token; ++k) {
            if (k > 0) {
                line_ += ' ';
            }
            line_ += std::to_string(ids[t * static_cast<size_t>(per_token) + static_cast<size_t>(k)]);
        }
        line_ += ',' + guess + '\n';
        std::fputs(line_.c_str(), file_);
    }
}

void RouteTrace::end_step() {
    if (std::fflush(file_) != 0) {
        throw Error("cannot write the route trace " + path_ + ": " + std::strerror(errno));
    }
}

}  // namespace bmoe::detail
