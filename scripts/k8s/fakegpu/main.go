// mgpu-fakegpu: a kubelet device plugin (API v1beta1) that advertises fake GPUs, for
// mgpu's Kubernetes test tier (tests/kubecluster.py).  A node "has" -count devices of
// -resource; a container given some gets NVIDIA_VISIBLE_DEVICES naming them, as from
// NVIDIA's plugin, and nothing else (there is no hardware behind them).
//
// It re-registers whenever the kubelet restarts: a starting kubelet removes every socket
// in its device-plugins directory, ours included, so a vanished socket means "register
// again".  Built by scripts/k8s/build.sh inside the Kubernetes source tree, whose vendor/
// holds grpc and the device-plugin API.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"google.golang.org/grpc"
	pluginapi "k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1"
)

type plugin struct {
	devices []*pluginapi.Device
}

func (p *plugin) GetDevicePluginOptions(context.Context, *pluginapi.Empty) (*pluginapi.DevicePluginOptions, error) {
	return &pluginapi.DevicePluginOptions{}, nil
}

func (p *plugin) ListAndWatch(_ *pluginapi.Empty, s pluginapi.DevicePlugin_ListAndWatchServer) error {
	if err := s.Send(&pluginapi.ListAndWatchResponse{Devices: p.devices}); err != nil {
		return err
	}
	<-s.Context().Done() // the devices never change; hold the stream open
	return nil
}

func (p *plugin) GetPreferredAllocation(context.Context, *pluginapi.PreferredAllocationRequest) (*pluginapi.PreferredAllocationResponse, error) {
	return &pluginapi.PreferredAllocationResponse{}, nil
}

func (p *plugin) Allocate(_ context.Context, r *pluginapi.AllocateRequest) (*pluginapi.AllocateResponse, error) {
	resp := &pluginapi.AllocateResponse{}
	for _, req := range r.ContainerRequests {
		env := map[string]string{"NVIDIA_VISIBLE_DEVICES": strings.Join(req.DevicesIDs, ",")}
		resp.ContainerResponses = append(resp.ContainerResponses, &pluginapi.ContainerAllocateResponse{Envs: env})
	}
	return resp, nil
}

func (p *plugin) PreStartContainer(context.Context, *pluginapi.PreStartContainerRequest) (*pluginapi.PreStartContainerResponse, error) {
	return &pluginapi.PreStartContainerResponse{}, nil
}

func dialUnix(ctx context.Context, addr string) (net.Conn, error) {
	return (&net.Dialer{}).DialContext(ctx, "unix", addr)
}

// serve listens on sock and registers it with the kubelet; the returned server runs
// until stopped.
func serve(p *plugin, dir, sock, resource string) (*grpc.Server, error) {
	path := filepath.Join(dir, sock)
	_ = os.Remove(path)
	lis, err := net.Listen("unix", path)
	if err != nil {
		return nil, err
	}
	srv := grpc.NewServer()
	pluginapi.RegisterDevicePluginServer(srv, p)
	go func() { _ = srv.Serve(lis) }()

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := grpc.DialContext(ctx, filepath.Join(dir, "kubelet.sock"), grpc.WithInsecure(),
		grpc.WithBlock(), grpc.WithContextDialer(dialUnix))
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("kubelet not reachable: %w", err)
	}
	defer conn.Close()
	_, err = pluginapi.NewRegistrationClient(conn).Register(ctx, &pluginapi.RegisterRequest{
		Version: pluginapi.Version, Endpoint: sock, ResourceName: resource,
		Options: &pluginapi.DevicePluginOptions{},
	})
	if err != nil {
		srv.Stop()
		return nil, fmt.Errorf("register: %w", err)
	}
	return srv, nil
}

func main() {
	dir := flag.String("dir", pluginapi.DevicePluginPath, "the kubelet's device-plugins directory")
	resource := flag.String("resource", "nvidia.com/gpu", "the extended resource advertised")
	count := flag.Int("count", 4, "how many devices this node has")
	prefix := flag.String("prefix", "GPU-fake", "device ID prefix (IDs are PREFIX-0, PREFIX-1, ...)")
	flag.Parse()

	p := &plugin{}
	for i := 0; i < *count; i++ {
		id := fmt.Sprintf("%s-%d", *prefix, i)
		p.devices = append(p.devices, &pluginapi.Device{ID: id, Health: pluginapi.Healthy})
	}
	sock := "mgpu-fakegpu.sock"
	var srv *grpc.Server
	for {
		if _, err := os.Stat(filepath.Join(*dir, sock)); srv != nil && err != nil {
			log.Printf("socket removed (kubelet restarted): registering again")
			srv.Stop()
			srv = nil
		}
		if srv == nil {
			var err error
			if srv, err = serve(p, *dir, sock, *resource); err != nil {
				log.Printf("%v; retrying", err)
			} else {
				log.Printf("registered %d x %s", *count, *resource)
			}
		}
		time.Sleep(500 * time.Millisecond)
	}
}
