"""Online serving: the front end that turns a stream of requests into batches (GSM, "Degree-Based
Scheduling and Memory Management for Large-Scale Exact Online GNN Inference", section IV).

WHY a subpackage: the offline serving modes (sparkgnn.serving) answer one request at a time; an
online server also has to decide which queued requests share a batch, how big a batch may grow and
how to split one that would not fit in memory. The scheduler and the tuner are pure algorithms,
free of any engine, so they can be tested and tuned on their own.

scheduler   request queue: Pending, ServiceModel, SCHEDULERS (fifo, degree with promotion), divide
tuner       offline parameter tuner: tune (two 1-D searches over T_d and T_s), candidate_ts,
            write_thresholds / read_thresholds (the JSON deployment config)
config      ServeConfig: a deployment's JSON settings, checked as a whole when loaded
server      Server(ServeConfig): the service, a façade over intake, dispatch, versions and stats
typed_service  TypedServer: the service on a typed graph (TypedQueryEngine per mode, HTTP only);
            server.open_service picks it or Server
intake      Intake: a request checked and queued, or answered at once; Outcome, Ticket
dispatch    Dispatcher: the batcher, the router (pools.ROUTERS), one dispatch thread per pool slot
versions    VersionManager: the version served, swaps without a restart, eviction of replaced ones
stats       ServiceMetrics (/metrics, the status line) and Tally (outcomes counted)
zmq_front   the ZeroMQ front (messenger frames); http_front: the HTTP/JSON front (aiohttp)
wire        requests, batches and answers as Arrow tables; BatchAnswers: a batch's answer in numpy, per request
costs       GraphFacts: what the front end knows of G (ids, in-degrees, PSGS)
pools       POOL_KINDS (inprocess, workers, sharded) and ROUTERS (first, psgs: Quiver)
sharded     pool kind "sharded": S workers each holding one shard of the PE store, answered by CGP;
            sharded_engine: the service-side deployment whose engines fan out to them
batch_op    op "serve_batch": a worker's deployment and its answer to a batch; "serve_evict";
            DeploymentCache: the deployments a worker holds
hotcache    CACHE_POLICIES (off, degree, fap) and HotRows: the hot stored rows
client      Client (ZeroMQ / HTTP); remote_engine: RemoteEngine for `--engine serve://`
cli         sparkgnn-serve serve | tune | swap
"""
