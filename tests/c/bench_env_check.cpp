// tools/bench_env.h on the host: `bench_env_check shapes LIST`, `only LIST NAME...`
// `s1 VALUE` or `tile VALUE` prints what the bench would take ("shapes R C; R C"), or the error
// line and exit status 2, as the bench does.
#include "bench_env.h"

#include <cstdio>
#include <cstring>

int main(int argc, char **argv) {
    if (argc < 3) return 64;
    std::string err;
    std::vector<bench_shape> shapes = {{1, 32}};
    if (strcmp(argv[1], "shapes") == 0) {
        err = bench_parse_shapes(argv[2], shapes);
        if (err.empty()) {
            printf("shapes");
            for (size_t i = 0; i < shapes.size(); i++)
                printf("%s %lld %lld", i ? ";" : "", (long long)shapes[i][0], (long long)shapes[i][1]);
            printf("\n");
        }
    } else if (strcmp(argv[1], "only") == 0) {
        err = bench_check_only(argv[2], std::vector<std::string>(argv + 3, argv + argc));
    } else if (strcmp(argv[1], "s1") == 0) {
        err = bench_check_s1(argv[2]);
    } else if (strcmp(argv[1], "tile") == 0) {
        err = bench_check_tile(argv[2]);
    } else {
        return 64;
    }
    if (!err.empty()) {
        fprintf(stderr, "%s\n", err.c_str());
        return 2;
    }
    return 0;
}
