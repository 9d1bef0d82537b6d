/* The GPU bench's settings from the environment, read strictly and before the GPU
 * is touched: a typo would otherwise time the default shapes, or no variant at
 * all, without a word. Each reader returns "" or a one-line error that names the
 * setting, what was wrong and what is allowed. Host C++17 only (tested on the host
 * by tests/integration/test_bench_env.py). */
#ifndef COLI_BENCH_ENV_H
#define COLI_BENCH_ENV_H

#include <array>
#include <cstdint>
#include <string>
#include <vector>

typedef std::array<int64_t, 2> bench_shape; /* rows, cols */

#define BENCH_SHAPE_MAX (1 << 20)       /* rows or columns */
#define BENCH_WEIGHTS_MAX (1LL << 30)   /* rows x columns: 4 GiB as f32, half the bench's GPU memory at most */

/* A decimal count at s[at..), digits only: the count, -1 if none is there or it is
 * 0, -2 if it is above BENCH_SHAPE_MAX. */
static inline int64_t bench_count(const std::string &s, size_t &at) {
    int64_t v = 0;
    const size_t from = at;
    bool over = false;
    for (; at < s.size() && s[at] >= '0' && s[at] <= '9'; at++) {
        over = over || v * 10 + (s[at] - '0') > BENCH_SHAPE_MAX;
        v = over ? v : v * 10 + (s[at] - '0');
    }
    return over ? -2 : at > from && v > 0 ? v : -1;
}

/* The pieces of a comma-separated list (an empty piece stays, so that it is an error). */
static inline std::vector<std::string> bench_split(const std::string &list) {
    std::vector<std::string> parts;
    size_t at = 0;
    for (size_t end; (end = list.find(',', at)) != std::string::npos; at = end + 1) parts.push_back(list.substr(at, end - at));
    parts.push_back(list.substr(at));
    return parts;
}

/* COLI_BENCH_SHAPES: ROWSxCOLS[,ROWSxCOLS...], each a count of 1..2^20, COLS a
 * multiple of 32 (int4's groups), ROWS x COLS at most 2^30. */
static inline std::string bench_parse_shapes(const std::string &list, std::vector<bench_shape> &shapes) {
    const std::string allowed = " (allowed: ROWSxCOLS[,ROWSxCOLS...], counts of 1 to 1048576, COLS a multiple of 32, "
                                "ROWS x COLS at most 2^30; e.g. 4096x4096,4096x14336)";
    std::vector<bench_shape> out;
    for (const std::string &item : bench_split(list)) {
        size_t at = 0;
        const int64_t rows = bench_count(item, at);
        const bool x = rows > 0 && at < item.size() && item[at] == 'x';
        at += x ? 1 : 0;
        const int64_t cols = x ? bench_count(item, at) : -1;
        if (rows == -2 || cols == -2) return "COLI_BENCH_SHAPES: '" + item + "' has a count above 1048576" + allowed;
        if (cols < 0 || at != item.size()) return "COLI_BENCH_SHAPES: '" + item + "' is not a shape" + allowed;
        if (cols % 32 != 0) return "COLI_BENCH_SHAPES: '" + item + "' has columns that are not a multiple of 32" + allowed;
        if (rows * cols > BENCH_WEIGHTS_MAX) return "COLI_BENCH_SHAPES: '" + item + "' is too large" + allowed;
        out.push_back({rows, cols});
    }
    shapes = out;
    return "";
}

/* COLI_BENCH_ONLY: name[,name...], each a part of at least one variant's name. */
static inline std::string bench_check_only(const std::string &list, const std::vector<std::string> &names) {
    for (const std::string &item : bench_split(list)) {
        bool found = false;
        for (const std::string &name : names) found = found || (!item.empty() && name.find(item) != std::string::npos);
        if (!found) {
            std::string all;
            for (const std::string &name : names) all += (all.empty() ? "" : ", ") + name;
            return "COLI_BENCH_ONLY: '" + item + "' is part of no variant's name (the variants: " + all + ")";
        }
    }
    return "";
}

/* A switch (COLI_BENCH_S1, COLI_BENCH_TILE): unset, 0 or 1; `meaning` says what 1 does. */
static inline std::string bench_check_switch(const std::string &name, const std::string &value, const std::string &meaning) {
    return value == "0" || value == "1" ? "" : name + ": '" + value + "' is not 0 or 1 (1: " + meaning + ")";
}
static inline std::string bench_check_s1(const std::string &value) { return bench_check_switch("COLI_BENCH_S1", value, "time S = 1 only"); }
static inline std::string bench_check_tile(const std::string &value) {
    return bench_check_switch("COLI_BENCH_TILE", value, "int4 tile by tile at every width, decode tiled variants only");
}

#endif
