package azuresim

import (
	"context"
	"strings"

	azfake "github.com/Azure/azure-sdk-for-go/sdk/azcore/fake"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v8"
)

// gallery is a compute gallery, its image definitions and their versions.
type gallery struct {
	armcompute.Gallery
	images map[string]*galleryImage
}

type galleryImage struct {
	armcompute.GalleryImage
	versions map[string]*armcompute.GalleryImageVersion
}

func (c *Cloud) serveGalleries() {
	gs := &c.compute.GalleriesServer
	gs.BeginCreateOrUpdate = func(_ context.Context, rg, name string, g armcompute.Gallery, _ *armcompute.GalleriesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armcompute.GalleriesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		grp, err := c.groupOf(rg)
		if err == nil {
			g.ID, g.Name = ptr(c.id(rg, "Microsoft.Compute/galleries", name)), ptr(name)
			if old, ok := grp.galleries[key(name)]; ok {
				old.Gallery = g
			} else {
				grp.galleries[key(name)] = &gallery{Gallery: g, images: map[string]*galleryImage{}}
			}
		}
		return lro(c, "GalleriesClient.BeginCreateOrUpdate", armcompute.GalleriesClientCreateOrUpdateResponse{Gallery: g}, err, nil)
	}
	is := &c.compute.GalleryImagesServer
	is.BeginCreateOrUpdate = func(_ context.Context, rg, galleryName, name string, img armcompute.GalleryImage, _ *armcompute.GalleryImagesClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armcompute.GalleryImagesClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		g, err := c.galleryOf(rg, galleryName)
		if err == nil {
			img.ID, img.Name = ptr(*g.ID+"/images/"+name), ptr(name)
			if old, ok := g.images[key(name)]; ok {
				old.GalleryImage = img
			} else {
				g.images[key(name)] = &galleryImage{GalleryImage: img, versions: map[string]*armcompute.GalleryImageVersion{}}
			}
		}
		return lro(c, "GalleryImagesClient.BeginCreateOrUpdate", armcompute.GalleryImagesClientCreateOrUpdateResponse{GalleryImage: img}, err, nil)
	}
	vs := &c.compute.GalleryImageVersionsServer
	vs.Get = func(_ context.Context, rg, galleryName, image, version string, _ *armcompute.GalleryImageVersionsClientGetOptions) (azfake.Responder[armcompute.GalleryImageVersionsClientGetResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		img, err := c.imageOf(rg, galleryName, image)
		if err == nil {
			if v, ok := img.versions[key(version)]; ok {
				return respond(armcompute.GalleryImageVersionsClientGetResponse{GalleryImageVersion: *v}, nil)
			}
			err = notFound("ResourceNotFound")
		}
		return respond(armcompute.GalleryImageVersionsClientGetResponse{}, err)
	}
	vs.BeginCreateOrUpdate = func(_ context.Context, rg, galleryName, image, version string, v armcompute.GalleryImageVersion, _ *armcompute.GalleryImageVersionsClientBeginCreateOrUpdateOptions) (azfake.PollerResponder[armcompute.GalleryImageVersionsClientCreateOrUpdateResponse], azfake.ErrorResponder) {
		c.mu.Lock()
		defer c.mu.Unlock()
		out, err := c.createVersion(rg, galleryName, image, version, v)
		return lro(c, "GalleryImageVersionsClient.BeginCreateOrUpdate", armcompute.GalleryImageVersionsClientCreateOrUpdateResponse{GalleryImageVersion: out}, err, nil)
	}
}

// createVersion makes an image version of a disk whose upload ended (its write access
// revoked), keeping the disk's bytes with it. Called with c.mu held.
func (c *Cloud) createVersion(rg, galleryName, image, version string, v armcompute.GalleryImageVersion) (armcompute.GalleryImageVersion, *apiError) {
	img, err := c.imageOf(rg, galleryName, image)
	if err != nil {
		return v, err
	}
	if _, ok := img.versions[key(version)]; ok {
		return v, conflict("ImageVersionAlreadyExists") // versions are immutable
	}
	p := v.Properties
	if p == nil || p.StorageProfile == nil || p.StorageProfile.OSDiskImage == nil || p.StorageProfile.OSDiskImage.Source == nil || p.StorageProfile.OSDiskImage.Source.ID == nil {
		return v, badRequest("InvalidParameter")
	}
	d, lerr := c.lookup(*p.StorageProfile.OSDiskImage.Source.ID)
	if lerr != nil {
		return v, badRequest("InvalidParameter")
	}
	disk := d.(*armcompute.Disk)
	if s := disk.Properties.DiskState; s != nil && (*s == armcompute.DiskStateActiveUpload || *s == armcompute.DiskStateReadyToUpload) {
		return v, conflict("OperationNotAllowed") // the upload has not ended
	}
	v.ID, v.Name = ptr(*img.ID+"/versions/"+version), ptr(version)
	p.ProvisioningState = ptr(armcompute.GalleryProvisioningStateSucceeded)
	img.versions[key(version)] = clone(&v)
	c.versionBytes[key(*v.ID)] = c.blobs[key(*disk.ID)].bytes()
	return v, nil
}

func (c *Cloud) galleryOf(rg, name string) (*gallery, *apiError) {
	grp, err := c.groupOf(rg)
	if err != nil {
		return nil, err
	}
	g, ok := grp.galleries[key(name)]
	if !ok {
		return nil, notFound("ResourceNotFound")
	}
	return g, nil
}

func (c *Cloud) imageOf(rg, galleryName, image string) (*galleryImage, *apiError) {
	g, err := c.galleryOf(rg, galleryName)
	if err != nil {
		return nil, err
	}
	img, ok := g.images[key(image)]
	if !ok {
		return nil, notFound("ResourceNotFound")
	}
	return img, nil
}

// ImageVersion returns an image version and the bytes of the disk it was made from (the
// uploaded page blob: the disk, its padding, the VHD footer).
func (c *Cloud) ImageVersion(id string) (armcompute.GalleryImageVersion, []byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	rg, _, galleryName, rest, ok := c.ref(id)
	if !ok {
		return armcompute.GalleryImageVersion{}, nil, false
	}
	parts := strings.Split(rest, "/")
	if len(parts) != 4 || !strings.EqualFold(parts[0], "images") || !strings.EqualFold(parts[2], "versions") {
		return armcompute.GalleryImageVersion{}, nil, false
	}
	image, version := parts[1], parts[3]
	img, err := c.imageOf(rg, galleryName, image)
	if err != nil {
		return armcompute.GalleryImageVersion{}, nil, false
	}
	v, found := img.versions[key(version)]
	if !found {
		return armcompute.GalleryImageVersion{}, nil, false
	}
	return *clone(v), c.versionBytes[key(id)], true
}

// ImageDefinition returns an image definition.
func (c *Cloud) ImageDefinition(rg, galleryName, image string) (armcompute.GalleryImage, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	img, err := c.imageOf(rg, galleryName, image)
	if err != nil {
		return armcompute.GalleryImage{}, false
	}
	return img.GalleryImage, true
}
